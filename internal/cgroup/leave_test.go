package cgroup

import (
	"context"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLeaveThread: a thread that c.JoinThread moved into a sandbox cgroup
// is back in the cgroup it came from in every hierarchy after
// c.LeaveThread, without JoinThread(name)'s mountinfo parse or mkdir; a
// missing or bad name is an error and leaves the thread where it was.
func TestLeaveThread(t *testing.T) {
	l := hostLayout(t)
	if l.Version == V2 {
		t.Skip("cgroup v2: JoinThread moves no thread (CLONE_INTO_CGROUP)")
	}
	home := randName(t, "cube-test-home-")
	parent := randName(t, "cube-test-leave-")
	c, err := OpenLayout(l, parent, "sb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deleteWhenThreadsEnd(t, home)
		for _, n := range []string{parent + "/sb", parent} {
			if err := DeleteEverywhere(context.Background(), n); err != nil {
				t.Errorf("delete %s: %v", n, err)
			}
		}
	})
	if err := c.Create(Resources{}); err != nil {
		t.Fatal(err)
	}
	type step struct {
		name, cgroups string
		err           error
	}
	steps := make(chan step, 8)
	onThrowawayThread(func() {
		defer close(steps)
		self := func(name string, err error) {
			b, _ := os.ReadFile("/proc/thread-self/cgroup")
			steps <- step{name, string(b), err}
		}
		if fd, err := JoinThread(home); err != nil {
			self("join home", err)
			return
		} else if fd >= 0 {
			unix.Close(fd)
		}
		if _, err := c.JoinThread(); err != nil {
			self("join sandbox", err)
			return
		}
		self("in sandbox", nil)
		self("leave to a missing cgroup", c.LeaveThread(randName(t, "cube-test-missing-")))
		self("leave to a bad name", c.LeaveThread("../x"))
		self("leave home", c.LeaveThread(home))
	})
	var got []step
	for s := range steps {
		got = append(got, s)
	}
	if len(got) != 4 {
		t.Fatalf("steps: %+v", got)
	}
	in := func(cgroups, name string) (n int) {
		for _, line := range strings.Split(strings.TrimSpace(cgroups), "\n") {
			if strings.HasSuffix(line, ":/"+name) {
				n++
			}
		}
		return n
	}
	sandbox := len(uniqueDirs(c.dirs))
	if got[0].err != nil || in(got[0].cgroups, parent+"/sb") != sandbox {
		t.Fatalf("after JoinThread: %v, want the thread in %s in %d hierarchies:\n%s", got[0].err, parent+"/sb", sandbox, got[0].cgroups)
	}
	for _, s := range got[1:3] {
		if s.err == nil {
			t.Errorf("%s: no error", s.name)
		}
	}
	if s := got[3]; s.err != nil || in(s.cgroups, parent+"/sb") != 0 || in(s.cgroups, home) == 0 {
		t.Errorf("after LeaveThread(%s): %v, want the thread out of the sandbox cgroup:\n%s", home, s.err, s.cgroups)
	}
}
