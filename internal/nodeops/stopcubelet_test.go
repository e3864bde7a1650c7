package nodeops

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCubeletTargets(t *testing.T) {
	procs := []proc{
		{1, []string{"/sbin/init"}, "mnt:[1]"},
		{10, []string{"/usr/local/bin/cube", "cubelet", "--server", "x"}, "mnt:[7]"},
		{11, []string{"/usr/local/bin/cube", "shim", "--id", "sb1"}, "mnt:[7]"},
		{12, []string{"/usr/local/bin/cube", "cubelet"}, "mnt:[8]"}, // another container
		{13, []string{"/.cube/envd"}, "mnt:[9]"},
		{14, []string{"cube", "kube", "stop-cubelet"}, "mnt:[7]"},
		{15, []string{"python3", "cubelet"}, "mnt:[7]"},
		{16, []string{""}, "mnt:[7]"},
	}
	if got := cubeletTargets(procs, 14, "mnt:[7]"); !slices.Equal(got, []int{10}) {
		t.Fatalf("targets = %v, want [10]", got)
	}
	if got := cubeletTargets(procs, 14, "mnt:[99]"); len(got) != 0 {
		t.Fatalf("targets in a foreign container = %v", got)
	}
}

// TestStopCubeletSignalsOnlyCubelet runs a fake cubelet and a fake shim (a
// shell renamed via argv) in this mount namespace: stop-cubelet ends the
// first and leaves the second running.
func TestStopCubeletSignalsOnlyCubelet(t *testing.T) {
	// bash runs the script file named by argv[1] from its working
	// directory, so argv reads "cube cubelet" or "cube shim".
	dir := t.TempDir()
	start := func(role string) *exec.Cmd {
		os.WriteFile(filepath.Join(dir, role), []byte("trap 'exit 0' TERM\nsleep 30 & wait\n"), 0o644)
		c := &exec.Cmd{Path: "/bin/bash", Args: []string{"cube", role}, Dir: dir}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	cubelet, shim := start("cubelet"), start("shim")
	waited := make(chan struct{})
	go func() { cubelet.Wait(); close(waited) }()
	// Only this test's children are candidates: a real cubelet of another
	// test on this machine must never be signalled.
	mine := func() []proc {
		var out []proc
		for _, p := range listProcs("/proc") {
			if p.pid == cubelet.Process.Pid || p.pid == shim.Process.Pid {
				out = append(out, p)
			}
		}
		return out
	}
	self, _ := os.Readlink("/proc/self/ns/mnt")
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if pids = cubeletTargets(mine(), os.Getpid(), self); len(pids) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake cubelet never showed up in /proc: %+v", mine())
		}
	}
	if pids[0] != cubelet.Process.Pid {
		t.Fatalf("targets = %v, want the cubelet %d", pids, cubelet.Process.Pid)
	}
	var out bytes.Buffer
	if err := terminate(context.Background(), &out, "/proc", pids, 5*time.Second); err != nil {
		t.Fatalf("stop: %v (%s)", err, out.String())
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("cubelet still running")
	}
	if err := shim.Process.Signal(syscallZero); err != nil {
		t.Fatalf("shim was hit: %v", err)
	}
	if !strings.Contains(out.String(), "sent SIGTERM to cubelet pid") {
		t.Fatalf("output %q", out.String())
	}
}

// syscallZero is signal 0: "does the process exist".
var syscallZero = syscall.Signal(0)
