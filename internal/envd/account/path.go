package account

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ResolvePath turns a client-supplied path into an absolute, cleaned path:
// "~" and "~/..." expand to home, relative paths resolve against base (the
// user's home or default workdir), and an empty path means base itself.
// Paths containing NUL bytes are ErrInvalidArgument.
func ResolvePath(p, base string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("path contains a NUL byte: %w", errdefs.ErrInvalidArgument)
	}
	if base == "" || !filepath.IsAbs(base) {
		base = "/"
	}
	switch {
	case p == "" || p == "~":
		return filepath.Clean(base), nil
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(base, p[2:]), nil
	case filepath.IsAbs(p):
		return filepath.Clean(p), nil
	default:
		return filepath.Join(base, p), nil
	}
}
