// Package files serves envd's plain-HTTP file transfer routes: streaming
// download (GET /files) and upload (POST /files, multipart or raw
// octet-stream, optionally gzip-encoded), plus E2B signed-URL verification.
package files

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Operations a signature can grant.
const (
	OpRead  = "read"
	OpWrite = "write"
)

// Sign returns the E2B v1 signature for path, operation, user and access
// token, with an optional expiration (unix seconds; 0 = none).
func Sign(path, op, user, token string, expiration int64) string {
	msg := path + ":" + op + ":" + user + ":" + token
	if expiration != 0 {
		msg += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(msg))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// VerifySignature checks the signature and signature_expiration query
// parameters of a /files request against token. It returns
// ErrUnauthenticated when the signature is absent, wrong or expired.
func VerifySignature(q url.Values, op, token string, now time.Time) error {
	sig := q.Get("signature")
	if sig == "" || token == "" {
		return fmt.Errorf("missing signature: %w", errdefs.ErrUnauthenticated)
	}
	var exp int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("bad signature_expiration: %w", errdefs.ErrUnauthenticated)
		}
		if now.Unix() > n {
			return fmt.Errorf("signature expired: %w", errdefs.ErrUnauthenticated)
		}
		exp = n
	}
	want := Sign(q.Get("path"), op, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return fmt.Errorf("signature does not match: %w", errdefs.ErrUnauthenticated)
	}
	return nil
}
