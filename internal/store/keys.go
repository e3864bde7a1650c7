package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// KeyPrefix starts every API key Cube generates.
const KeyPrefix = "cube_"

// lastUsedResolution bounds how often a key's last_used_at is written.
const lastUsedResolution = time.Minute

// HashKey returns the stored form of a plaintext API key (sha256, hex).
func HashKey(plaintext string) string {
	sum := sha256.Sum256([]byte(plaintext))
	return hex.EncodeToString(sum[:])
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// CreateKey generates a new key ("cube_" + 40 hex chars), stores its hash
// and returns the plaintext, which is not recoverable afterwards.
func (s *sqlStore) CreateKey(ctx context.Context, name string) (string, error) {
	secret, err := randomHex(20)
	if err != nil {
		return "", fmt.Errorf("create api key: %w", err)
	}
	plaintext := KeyPrefix + secret
	if _, err := s.AddKeyHash(ctx, name, plaintext); err != nil {
		return "", err
	}
	return plaintext, nil
}

// AddKeyHash stores the hash of a key given from outside (flag, env, file)
// and returns its id. Adding the same key again returns the existing id; a
// revoked key is not revived (ErrConflict).
func (s *sqlStore) AddKeyHash(ctx context.Context, name, plaintext string) (string, error) {
	if strings.TrimSpace(plaintext) == "" {
		return "", fmt.Errorf("add api key: %w: empty key", errdefs.ErrInvalidArgument)
	}
	hash := HashKey(plaintext)
	id, err := randomHex(8)
	if err != nil {
		return "", fmt.Errorf("add api key: %w", err)
	}
	_, err = s.db.ExecContext(ctx, s.d.bind(`INSERT INTO api_keys (id, name, hash, created_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (hash) DO NOTHING`), id, name, hash, toNanos(s.now()))
	if err != nil {
		return "", fmt.Errorf("add api key: %w", err)
	}
	var (
		gotID   string
		revoked sql.NullInt64
	)
	if err := s.db.QueryRowContext(ctx, s.d.bind(`SELECT id, revoked_at FROM api_keys WHERE hash = ?`), hash).Scan(&gotID, &revoked); err != nil {
		return "", fmt.Errorf("add api key: %w", err)
	}
	if revoked.Valid {
		return "", fmt.Errorf("add api key: %w: key %s was revoked; generate a new key", errdefs.ErrConflict, gotID)
	}
	return gotID, nil
}

// RevokeKey marks a key revoked; ErrNotFound if unknown. Revoking twice is a no-op.
func (s *sqlStore) RevokeKey(ctx context.Context, id string) error {
	return s.execOne(ctx, "revoke api key "+id,
		`UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?`, toNanos(s.now()), id)
}

// ListKeys returns all keys, revoked ones included, oldest first.
func (s *sqlStore) ListKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(`SELECT id, name, created_at, last_used_at, revoked_at FROM api_keys ORDER BY created_at, id`))
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		var (
			k             APIKey
			created       int64
			used, revoked sql.NullInt64
		)
		if err := rows.Scan(&k.ID, &k.Name, &created, &used, &revoked); err != nil {
			return nil, fmt.Errorf("list api keys: %w", err)
		}
		k.CreatedAt, k.LastUsedAt, k.RevokedAt = fromNanos(created), nullNanos(used), nullNanos(revoked)
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	return out, nil
}

// VerifyKey returns the id of the active key whose hash matches plaintext,
// comparing against every active key in constant time; ErrUnauthenticated
// when none does.
func (s *sqlStore) VerifyKey(ctx context.Context, plaintext string) (string, error) {
	if plaintext == "" {
		return "", fmt.Errorf("verify api key: %w: no key given", errdefs.ErrUnauthenticated)
	}
	want := sha256.Sum256([]byte(plaintext))
	rows, err := s.db.QueryContext(ctx, s.d.bind(`SELECT id, hash, last_used_at FROM api_keys WHERE revoked_at IS NULL`))
	if err != nil {
		return "", fmt.Errorf("verify api key: %w: %w", errdefs.ErrUnavailable, err)
	}
	defer rows.Close()
	var found string
	var foundUsed sql.NullInt64
	for rows.Next() {
		var id, h string
		var used sql.NullInt64
		if err := rows.Scan(&id, &h, &used); err != nil {
			return "", fmt.Errorf("verify api key: %w: %w", errdefs.ErrUnavailable, err)
		}
		got, err := hex.DecodeString(h)
		if err != nil || len(got) != len(want) {
			continue
		}
		if subtle.ConstantTimeCompare(got, want[:]) == 1 {
			found, foundUsed = id, used
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("verify api key: %w: %w", errdefs.ErrUnavailable, err)
	}
	rows.Close()
	if found == "" {
		return "", fmt.Errorf("verify api key: %w: invalid API key", errdefs.ErrUnauthenticated)
	}
	now := s.now()
	// Bookkeeping only: the key is valid even if this write fails. It is
	// written at most once per lastUsedResolution: a write on every request
	// made every API call take SQLite's write lock, and a burst of creates
	// queued behind it.
	if foundUsed.Valid && foundUsed.Int64 >= toNanos(now.Add(-lastUsedResolution)) {
		return found, nil
	}
	_, _ = s.db.ExecContext(ctx, s.d.bind(`UPDATE api_keys SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)`),
		toNanos(now), found, toNanos(now.Add(-lastUsedResolution)))
	return found, nil
}
