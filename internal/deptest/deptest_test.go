package deptest

import "testing"

func TestMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, pkg string
		want         bool
	}{
		{"net/http", "net/http", true},
		{"net/http", "net/http/httptrace", false},
		{"net/http/...", "net/http", true},
		{"net/http/...", "net/http/httptrace", true},
		{"net/http/...", "net/httpx", false},
		{"github.com/cube-dev/cube/internal/cgroup", "github.com/cube-dev/cube/internal/cgroup/control", false},
	} {
		if got := matches(tc.pattern, tc.pkg); got != tc.want {
			t.Errorf("matches(%q, %q) = %v, want %v", tc.pattern, tc.pkg, got, tc.want)
		}
	}
}

// Forbid sees this package's own dependencies.
func TestForbidSeesDeps(t *testing.T) {
	ft := &recorder{TB: t}
	Forbid(ft, ".", "os/exec")
	if !ft.failed {
		t.Fatal("deptest links os/exec, and Forbid did not report it")
	}
}

type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Errorf(string, ...any) { r.failed = true }
