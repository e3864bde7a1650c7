package version

import (
	"errors"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestCheckSkew(t *testing.T) {
	cases := []struct {
		server, cubelet string
		ok              bool
	}{
		{"v0.5.0", "v0.5.0", true},
		{"v0.5.3", "v0.5.1", true},
		{"v0.5.0", "v0.4.9", true},
		{"v0.5.0", "0.4.0-rc.1", true},
		{"v0.5.0", "v0.3.9", false}, // two minors behind
		{"v0.5.0", "v0.6.0", false}, // cubelet newer
		{"v1.0.0", "v0.9.0", false}, // other major
		{"v1.1.0", "v1.0.7", true},
	}
	for _, c := range cases {
		err := CheckSkew(c.server, c.cubelet)
		if (err == nil) != c.ok {
			t.Errorf("CheckSkew(%s, %s) = %v, want ok=%v", c.server, c.cubelet, err, c.ok)
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), c.server) || !strings.Contains(err.Error(), c.cubelet) {
				t.Errorf("error must name both versions and be FailedPrecondition: %v", err)
			}
		}
	}
	for _, bad := range []string{"", "v1", "v1.2", "vx.y.z", "1.2.3.4", "1.-2.3"} {
		if err := CheckSkew("v1.0.0", bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckSkew with %q: %v", bad, err)
		}
	}
}
