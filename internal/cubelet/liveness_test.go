package cubelet

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/supervisor"
)

// shimAlive reports whether the shim of the runtime called name answers
// and its sandbox runs (tests only: the cubelet itself asks livenessOf).
func (c *Cubelet) shimAlive(ctx context.Context, name string) bool {
	l, _ := probe(ctx, c.sandboxDir(name), false)
	return l == livenessAlive
}

// TestKeepRecord: only a running sandbox whose supervisor is not known to
// be gone survives a check; a record a crash left creating or deleting
// never does, whatever its supervisor says.
func TestKeepRecord(t *testing.T) {
	for _, tc := range []struct {
		state string
		l     liveness
		want  bool
	}{
		{nodestore.StateRunning, livenessAlive, true},
		{nodestore.StateRunning, livenessUnknown, true},
		{nodestore.StateRunning, livenessDead, false},
		{nodestore.StateCreating, livenessAlive, false},
		{nodestore.StateCreating, livenessUnknown, false},
		{nodestore.StateDeleting, livenessAlive, false},
		{nodestore.StateDeleting, livenessDead, false},
	} {
		if got := keepRecord(nodestore.Sandbox{ID: "x", State: tc.state}, tc.l); got != tc.want {
			t.Errorf("keepRecord(%s, %s) = %v, want %v", tc.state, tc.l, got, tc.want)
		}
	}
}

// TestProbeVerdicts drives probe over state dirs a real node can hold
// without a sandbox: no supervisor recorded or its process gone (dead), a
// record of a newer schema, a live process that does not answer, a
// cancelled caller (unknown: nothing may be torn down on them).
func TestProbeVerdicts(t *testing.T) {
	writeInfo := func(t *testing.T, dir string, info supervisor.Info) {
		t.Helper()
		b, _ := json.Marshal(info)
		if err := os.WriteFile(filepath.Join(dir, supervisor.InfoFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A real process that stays alive and never answers on the socket.
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, dir string)
		cancel bool
		want   liveness
	}{
		{"no record", func(*testing.T, string) {}, false, livenessDead},
		{"process gone", func(t *testing.T, dir string) {
			writeInfo(t, dir, supervisor.Info{Schema: supervisor.SchemaVersion, PID: exited.Process.Pid})
		}, false, livenessDead},
		{"newer schema", func(t *testing.T, dir string) {
			writeInfo(t, dir, supervisor.Info{Schema: supervisor.SchemaVersion + 1, PID: sleeper.Process.Pid})
		}, false, livenessUnknown},
		{"silent", func(t *testing.T, dir string) {
			writeInfo(t, dir, supervisor.Info{Schema: supervisor.SchemaVersion, PID: sleeper.Process.Pid})
			// Connections queue in the backlog and are never answered.
			ln, err := net.Listen("unix", filepath.Join(dir, supervisor.SocketFile))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
		}, false, livenessUnknown},
		{"cancelled", func(t *testing.T, dir string) {
			writeInfo(t, dir, supervisor.Info{Schema: supervisor.SchemaVersion, PID: sleeper.Process.Pid})
		}, true, livenessUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			ctx, cancel := context.WithCancel(context.Background())
			if tc.cancel {
				cancel()
			}
			defer cancel()
			start := time.Now()
			got, p := probe(ctx, dir, true)
			if got != tc.want || p.watch != nil {
				t.Fatalf("probe = %s (watch %v), want %s", got, p.watch, tc.want)
			}
			if took := time.Since(start); took > probeTimeout+time.Second {
				t.Fatalf("probe took %v, bound %v", took, probeTimeout)
			}
		})
	}
}

// The sweep of dead sandboxes of a cubelet that is shutting down must not
// take its cancelled probes for dead shims: before the fix, a `cube up`
// stopped with --keep-sandboxes in the middle of a sweep tore down every
// sandbox the sweep had not reached yet (the bench's restart phase lost
// 4-10 of 500).
func TestSweepDeadKeepsSandboxesWhenCancelled(t *testing.T) {
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
	if dead := c.sweepDead(ctx); len(dead) != 0 {
		t.Fatalf("removed %v with a cancelled context", dead)
	}
	for _, id := range []string{"live-a", "live-b"} {
		if r, err := c.store.Get(id); err != nil || r.State != nodestore.StateRunning {
			t.Errorf("%s: record %+v, %v", id, r, err)
		}
		if err := envdHealthy(t, c, id); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	// A shim that really is gone still has its sandbox removed.
	waitGone(t, killShim(t, c, "live-b"))
	if dead := c.sweepDead(context.Background()); len(dead) != 1 || dead[0] != "live-b" {
		t.Fatalf("removed %v, want [live-b]", dead)
	}
}

// A shim that does not answer (stopped, overloaded) at start-up proves
// nothing: Reconcile keeps its sandbox instead of tearing it down, and
// Inspect says so.
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
	// Inspect judges it as reconcile does: kept (live, its mapping owned),
	// reported as a silent shim, not as dead.
	in, err := Inspect(context.Background(), n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Findings) != 1 || in.Findings[0].Kind != FindingSilentShim || len(in.Live) != 1 || in.Live[0] != "frozen" ||
		len(in.Mappings) != 1 || in.Mappings[0].Status != StatusOwned {
		t.Fatalf("inspect of a stopped shim: findings %+v, live %v, mappings %+v", in.Findings, in.Live, in.Mappings)
	}
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

// TestLivenessRoundsPollWatchedShims: a sweep calls a shim only until it
// has a watch on its process; later sweeps ask the kernel. A watched shim
// that dies is still found (by the full probe its exit triggers) and its
// sandbox removed, and a torn-down sandbox's watch goes.
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
	if dead := c.sweepDead(ctx); len(dead) != 0 {
		t.Fatalf("removed %v", dead)
	}
	if n := c.probes.Load() - before; n != 2 {
		t.Fatalf("first round probed %d shims, want 2", n)
	}
	before = c.probes.Load()
	for range 3 {
		if dead := c.sweepDead(ctx); len(dead) != 0 {
			t.Fatalf("removed %v", dead)
		}
	}
	if n := c.probes.Load() - before; n != 0 {
		t.Fatalf("rounds over watched shims made %d calls, want 0", n)
	}

	killShim(t, c, "watch-b")
	// Its pidfd turns readable once the last of its threads is gone, a
	// moment after the process shows as a zombie: the next rounds find it.
	var dead []string
	for deadline := time.Now().Add(5 * time.Second); len(dead) == 0 && time.Now().Before(deadline); {
		dead = c.sweepDead(ctx)
		time.Sleep(10 * time.Millisecond)
	}
	if len(dead) != 1 || dead[0] != "watch-b" {
		t.Fatalf("removed %v, want [watch-b]", dead)
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
