package cubelet

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

// The liveness check of a cubelet that is shutting down must not take its
// cancelled probes for dead shims: before the fix, a `cube up` stopped
// with --keep-sandboxes in the middle of a check tore down every sandbox
// the check had not reached yet (the bench's restart phase lost 4-10 of
// 500).
func TestReapDeadKeepsSandboxesWhenCancelled(t *testing.T) {
	n := newTestNode(t)
	c := n.start(t)
	defer c.Close()
	for _, id := range []string{"live-a", "live-b"} {
		if _, err := c.CreateSandbox(context.Background(), createReq(id)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if reaped := c.reapDead(ctx); len(reaped) != 0 {
		t.Fatalf("reaped %v with a cancelled context", reaped)
	}
	for _, id := range []string{"live-a", "live-b"} {
		if r, err := c.store.Get(id); err != nil || r.State != nodestore.StateRunning {
			t.Errorf("%s: record %+v, %v", id, r, err)
		}
		if err := envdHealthy(t, c, id); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	// A shim that really is gone is still reaped.
	waitGone(t, killShim(t, c, "live-b"))
	if reaped := c.reapDead(context.Background()); len(reaped) != 1 || reaped[0] != "live-b" {
		t.Fatalf("reaped %v, want [live-b]", reaped)
	}
}

// A shim that does not answer (stopped, overloaded) at start-up proves
// nothing: Reconcile keeps its sandbox instead of tearing it down.
func TestReconcileKeepsSandboxOfUnansweringShim(t *testing.T) {
	n := newTestNode(t)
	c := n.start(t)
	if _, err := c.CreateSandbox(context.Background(), createReq("frozen")); err != nil {
		t.Fatal(err)
	}
	rec, _ := c.store.Get("frozen")
	sb, err := nsrt.Attach(context.Background(), c.sandboxDir(rec.Runtime()))
	if err != nil {
		t.Fatal(err)
	}
	shimPID := sb.ShimPID()
	sb.Close()
	c.Close()
	if err := syscall.Kill(shimPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(shimPID, syscall.SIGCONT)
		}
	}()
	c = n.start(t) // reconciles: the probe times out
	defer c.Close()
	if r, err := c.store.Get("frozen"); err != nil || r.State != nodestore.StateRunning {
		t.Fatalf("sandbox of a stopped shim not kept: %+v, %v", r, err)
	}
	syscall.Kill(shimPID, syscall.SIGCONT)
	stopped = false
	if err := envdHealthy(t, c, "frozen"); err != nil {
		t.Fatal(err)
	}
	assertClean(t, c, "frozen")
}

// waitGone waits until pid has exited (and been reaped by whoever reaps it).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for range 500 {
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		if state, err := procState(pid); err == nil && state == 'Z' {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %d still running", pid)
}

// procState returns the state letter of pid from /proc/<pid>/stat.
func procState(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, os.ErrInvalid
	}
	return b[i+2], nil
}

// TestLivenessRoundsPollWatchedShims: a liveness round calls a shim only
// until it has a watch on its process; later rounds ask the kernel. A
// watched shim that dies is still found (by the full probe its exit
// triggers) and its sandbox reaped, and a torn-down sandbox's watch goes.
func TestLivenessRoundsPollWatchedShims(t *testing.T) {
	n := newTestNode(t)
	c := n.start(t)
	defer c.Close()
	ctx := context.Background()
	for _, id := range []string{"watch-a", "watch-b"} {
		if _, err := c.CreateSandbox(ctx, createReq(id)); err != nil {
			t.Fatal(err)
		}
	}
	before := c.probes.Load()
	if reaped := c.reapDead(ctx); len(reaped) != 0 {
		t.Fatalf("reaped %v", reaped)
	}
	if n := c.probes.Load() - before; n != 2 {
		t.Fatalf("first round probed %d shims, want 2", n)
	}
	before = c.probes.Load()
	for range 3 {
		if reaped := c.reapDead(ctx); len(reaped) != 0 {
			t.Fatalf("reaped %v", reaped)
		}
	}
	if n := c.probes.Load() - before; n != 0 {
		t.Fatalf("rounds over watched shims made %d calls, want 0", n)
	}

	killShim(t, c, "watch-b")
	// Its pidfd turns readable once the last of its threads is gone, a
	// moment after the process shows as a zombie: the next rounds find it.
	var reaped []string
	for deadline := time.Now().Add(5 * time.Second); len(reaped) == 0 && time.Now().Before(deadline); {
		reaped = c.reapDead(ctx)
		time.Sleep(10 * time.Millisecond)
	}
	if len(reaped) != 1 || reaped[0] != "watch-b" {
		t.Fatalf("reaped %v, want [watch-b]", reaped)
	}
	if err := c.KillSandbox(ctx, "watch-a"); err != nil {
		t.Fatal(err)
	}
	c.watches.mu.Lock()
	left := len(c.watches.m)
	c.watches.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d watches left after every sandbox went", left)
	}
	assertClean(t, c)
}

// killShim SIGKILLs the shim of sandbox id and returns its pid.
func killShim(t *testing.T, c *Cubelet, id string) int {
	t.Helper()
	rec, err := c.store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := nsrt.Attach(context.Background(), c.sandboxDir(rec.Runtime()))
	if err != nil {
		t.Fatal(err)
	}
	pid := sb.ShimPID()
	sb.Close()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return pid
}
