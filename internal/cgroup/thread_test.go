package cgroup

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestJoinThreadPlacesChildren: a process forked from a thread that
// JoinThread moved starts in the cgroup in every hierarchy (v1 by the
// thread's membership, the unified one by CLONE_INTO_CGROUP), without a
// migration of its own; the rest of the test process stays where it was.
func TestJoinThreadPlacesChildren(t *testing.T) {
	l := hostLayout(t)
	name := randName(t, "cube-test-join-")
	before, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		cmd *exec.Cmd
		err error
	}
	res := make(chan result, 1)
	onThrowawayThread(func() {
		fd, err := JoinThread(name)
		if err != nil {
			res <- result{err: err}
			return
		}
		cmd := exec.Command("/bin/busybox", "sleep", "1000")
		if fd >= 0 {
			defer unix.Close(fd)
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		}
		res <- result{cmd, cmd.Start()}
	})
	r := <-res
	t.Cleanup(func() {
		if r.cmd != nil && r.cmd.Process != nil {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		}
		deleteWhenThreadsEnd(t, name)
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(r.cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasSuffix(line, ":/"+name) {
			t.Errorf("child not in %s: %s", name, line)
		}
	}
	if after, _ := os.ReadFile("/proc/self/cgroup"); string(after) != string(before) {
		t.Errorf("the test process moved:\n%s\nwas\n%s", after, before)
	}
	if InAll(name) {
		t.Errorf("InAll(%s) for a process that is not there", name)
	}
	if len(l.V1) > 0 {
		// The primed thread moves where nothing else is and ends.
		PrimeMigration(name)
		time.Sleep(100 * time.Millisecond)
		if after, _ := os.ReadFile("/proc/self/cgroup"); string(after) != string(before) {
			t.Errorf("PrimeMigration moved the test process:\n%s", after)
		}
	}
	if _, err := JoinThread("../x"); err == nil {
		t.Error("JoinThread accepted a bad name")
	}
}

// TestInAll: a process moved everywhere by MoveAll is InAll there.
func TestInAll(t *testing.T) {
	hostLayout(t)
	name := randName(t, "cube-test-inall-")
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), "CUBE_CGROUP_TEST_INALL="+name)
	// The check runs in a child: InAll reads /proc/self/cgroup.
	t.Cleanup(func() { deleteWhenThreadsEnd(t, name) })
	done := make(chan error, 1)
	onThrowawayThread(func() {
		fd, err := JoinThread(name)
		if err != nil {
			done <- err
			return
		}
		if fd >= 0 {
			defer unix.Close(fd)
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		}
		out, err := cmd.CombinedOutput()
		if err == nil && !strings.Contains(string(out), "inall=true") {
			t.Errorf("child not InAll(%s): %s", name, out)
		}
		done <- err
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// deleteWhenThreadsEnd removes the cgroup name once the throwaway threads
// that joined it have ended (they end just after their goroutine).
func deleteWhenThreadsEnd(t *testing.T, name string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = DeleteEverywhere(context.Background(), name); err == nil {
			return
		}
	}
	t.Errorf("DeleteEverywhere: %v", err)
}

// onThrowawayThread runs fn in a goroutine on a locked OS thread that
// ends with it, never the main thread (which cannot end, and whose cgroups
// /proc/self/cgroup shows).
func onThrowawayThread(fn func()) {
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if unix.Gettid() == unix.Getpid() {
			onThrowawayThread(fn)
			runtime.UnlockOSThread()
			return
		}
		fn()
	}()
}

func init() {
	if name := os.Getenv("CUBE_CGROUP_TEST_INALL"); name != "" {
		println("inall=" + strconv.FormatBool(InAll(name)))
		os.Exit(0)
	}
}
