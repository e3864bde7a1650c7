package cubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/nsrt"
)

// A sandbox's pid 1 is cube-reaper when it sits next to envd, with and
// without a user namespace, and envd itself (its pid-1 mode) when it does
// not; either way envd serves and the sandbox is torn down cleanly.
func TestReaperIsPID1(t *testing.T) {
	lone := filepath.Join(t.TempDir(), "envd")
	b, err := os.ReadFile(envdBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lone, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, envd string
		userns     nsrt.UserNSMode
		want       string
	}{
		{"reaper", envdBinary(t), nsrt.UserNSOff, "reaper"},
		{"reaper-userns", envdBinary(t), nsrt.UserNSAuto, "reaper"},
		{"envd-fallback", lone, nsrt.UserNSOff, "envd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t)
			n.cfg.EnvdPath, n.cfg.UserNS, n.cfg.PoolSize = tc.envd, tc.userns, 0
			c := n.start(t)
			defer c.Close()
			id := "pid1-" + tc.name
			if _, err := c.CreateSandbox(context.Background(), createReq(id)); err != nil {
				t.Fatal(err)
			}
			if err := envdHealthy(t, c, id); err != nil {
				t.Fatal(err)
			}
			rec, _ := c.store.Get(id)
			sb, err := nsrt.Attach(context.Background(), c.sandboxDir(rec.Runtime()))
			if err != nil {
				t.Fatal(err)
			}
			pid := sb.InitPID()
			sb.Close()
			comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(string(comm)); got != tc.want {
				t.Errorf("pid 1 (%d) runs %q, want %q", pid, got, tc.want)
			}
			if kids := children(t, pid); len(kids) != 1 {
				t.Errorf("pid 1 has children %v, want envd alone", kids)
			}
			if err := c.KillSandbox(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			assertClean(t, c)
		})
	}
}

// children lists the pids whose parent is pid (each thread lists the
// children it forked).
func children(t *testing.T, pid int) []int {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil || len(files) == 0 {
		t.Fatalf("tasks of %d: %v", pid, err)
	}
	var out []int
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, w := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(w)
			out = append(out, n)
		}
	}
	return out
}
