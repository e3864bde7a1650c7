package version

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Semver is a parsed major.minor.patch version.
type Semver struct{ Major, Minor, Patch int }

// Parse reads "v1.2.3" or "1.2.3" (a pre-release or build suffix is ignored).
func Parse(s string) (Semver, error) {
	t := strings.TrimPrefix(s, "v")
	if i := strings.IndexAny(t, "-+"); i >= 0 {
		t = t[:i]
	}
	parts := strings.Split(t, ".")
	if len(parts) != 3 {
		return Semver{}, fmt.Errorf("version %q is not major.minor.patch: %w", s, errdefs.ErrInvalidArgument)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Semver{}, fmt.Errorf("version %q is not major.minor.patch: %w", s, errdefs.ErrInvalidArgument)
		}
		n[i] = v
	}
	return Semver{n[0], n[1], n[2]}, nil
}

// CheckSkew applies the version-skew policy between a server and a
// cubelet: same major version, and the cubelet's minor version equal to the
// server's or one older. Anything else is refused with an error naming both.
func CheckSkew(server, cubelet string) error {
	s, err := Parse(server)
	if err != nil {
		return err
	}
	c, err := Parse(cubelet)
	if err != nil {
		return err
	}
	if s.Major == c.Major && (c.Minor == s.Minor || c.Minor == s.Minor-1) {
		return nil
	}
	return fmt.Errorf("cubelet version %s is not supported by server version %s: a cubelet may be at most one minor version older than the server and never newer; upgrade the server first, then cubelets one node at a time: %w",
		cubelet, server, errdefs.ErrFailedPrecondition)
}
