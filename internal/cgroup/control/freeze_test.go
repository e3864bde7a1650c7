package control

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// freezerGroup makes a cgroup that holds only a freezer (v1) or a unified
// directory (v2), removed at the end of the test. It skips where the test
// cannot create cgroups.
func freezerGroup(t *testing.T) Group {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	name := fmt.Sprintf("cube-control-test-%d", os.Getpid())
	g := Group{}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		g.V2 = true
		g.Freezer = filepath.Join("/sys/fs/cgroup", name)
	} else if _, err := os.Stat("/sys/fs/cgroup/freezer/cgroup.procs"); err == nil {
		g.Freezer = filepath.Join("/sys/fs/cgroup/freezer", name)
	} else {
		t.Skip("no v1 freezer hierarchy")
	}
	if err := os.Mkdir(g.Freezer, 0o755); err != nil {
		t.Skipf("create cgroup: %v", err)
	}
	g.Dirs = []string{g.Freezer}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Kill(ctx); err != nil {
			t.Errorf("kill the test cgroup: %v", err)
		}
		if err := os.Remove(g.Freezer); err != nil {
			t.Errorf("remove the test cgroup: %v", err)
		}
	})
	return g
}

// A cgroup whose processes fork without pause still freezes, every time:
// on v1 a freeze can stay FREEZING while children are being forked, and
// Freeze must push it through (the template commit freezes such sandboxes).
func TestFreezeForkingGroup(t *testing.T) {
	g := freezerGroup(t)
	for range 4 {
		cmd := exec.Command("/bin/sh", "-c", "while :; do /bin/true; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		if err := WriteFile(filepath.Join(g.Freezer, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid))); err != nil {
			t.Fatal(err)
		}
	}
	const rounds = 200
	var slowest time.Duration
	for i := range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err := g.Freeze(ctx)
		slowest = max(slowest, time.Since(start))
		if err == nil {
			err = g.Thaw(ctx)
		}
		cancel()
		if err != nil {
			t.Fatalf("round %d of %d: %v", i+1, rounds, err)
		}
	}
	t.Logf("%d freezes, slowest %v", rounds, slowest)
}
