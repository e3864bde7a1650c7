package master

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

const (
	idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	idLength   = 20
)

// newSandboxID returns 20 random characters from [a-z0-9], a valid DNS label.
func newSandboxID() (string, error) {
	out := make([]byte, 0, idLength)
	buf := make([]byte, 32)
	for len(out) < idLength {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("sandbox id: %w", err)
		}
		for _, b := range buf {
			// 252 = 7*36: reject the tail to keep the distribution uniform.
			if b < 252 && len(out) < idLength {
				out = append(out, idAlphabet[int(b)%len(idAlphabet)])
			}
		}
	}
	return string(out), nil
}

// newAccessToken returns 32 random bytes, hex encoded.
func newAccessToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("access token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// ValidSandboxID reports whether id has the shape of a sandbox id Cube issues.
func ValidSandboxID(id string) bool {
	if len(id) != idLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
