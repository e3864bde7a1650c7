package nsrt

import (
	"bufio"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestSandboxOfCgroupFile(t *testing.T) {
	cases := []struct{ file, parent, want string }{
		{"12:pids:/cube/sb-1\n11:memory:/cube/sb-1\n0::/\n", "cube", "sb-1"},
		{"0::/cube/sb-2\n", "", "sb-2"},
		{"0::/../../cube/sb-3/child\n", "cube", "sb-3"}, // seen from a pod's cgroup namespace
		{"5:cpu:/kubepods/x/cube-sec-1/sb-4\n", "cube-sec-1", "sb-4"},
		{"0::/cube-shims/sb-5\n", "cube", ""}, // the shim, not the sandbox
		{"0::/cube\n", "cube", ""},
		{"0::/user.slice\n", "cube", ""},
		{"garbage\n", "cube", ""},
	}
	for _, c := range cases {
		got, err := sandboxOfCgroupFile(bufio.NewScanner(strings.NewReader(c.file)), c.parent, 1)
		if c.want == "" {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%q: got %q, %v; want ErrNotFound", c.file, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: got %q, %v; want %q", c.file, got, err, c.want)
		}
	}
	if _, err := SandboxOfPID(os.Getpid(), "no-such-parent-x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("own process: %v, want ErrNotFound", err)
	}
}
