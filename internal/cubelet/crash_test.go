package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/failpoint"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/template"
)

// crashEnv carries a test node's config into a child cubelet process.
const crashEnv = "CUBE_TEST_NODE"

type crashSpec struct {
	Cfg       Config `json:"cfg"`
	Templates string `json:"templates"`
	ID        string `json:"id"`
	// Closed creates the sandbox without internet access (not the
	// default egress policy a slot has).
	Closed bool `json:"closed"`
	// Fail: a failpoint makes the create (or, with no ID, the making of a
	// slot) fail; the child checks that it left nothing behind.
	Fail bool `json:"fail"`
}

// crashSpec returns s for a child process, with the node's config.
func (n *node) crashSpec(s crashSpec) string {
	s.Cfg, s.Templates = n.cfg, n.templates.Dir
	s.Cfg.Logger = nil
	b, _ := json.Marshal(s)
	return string(b)
}

func childCubelet() (*Cubelet, crashSpec, error) {
	var s crashSpec
	if err := json.Unmarshal([]byte(os.Getenv(crashEnv)), &s); err != nil {
		return nil, s, err
	}
	s.Cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := New(context.Background(), s.Cfg, &template.Registry{Dir: s.Templates})
	return c, s, err
}

// crashCreateMain runs in a child process: create a sandbox with failpoints
// from the environment (which SIGKILL the process at one step).
func crashCreateMain([]string) int {
	c, spec, err := childCubelet()
	if err != nil {
		return 3
	}
	if spec.Fail && spec.ID == "" {
		return failMain(c, func(ctx context.Context) error { _, err := c.makeSlot(ctx, mainTarget, nil); return err })
	}
	// With a warm pool, crash on the pool path: wait for a ready slot.
	for deadline := time.Now().Add(20 * time.Second); c.cfg.PoolSize > 0 && c.PoolSize() == 0; {
		if time.Now().After(deadline) {
			return 5
		}
		time.Sleep(10 * time.Millisecond)
	}
	req := createReq(spec.ID)
	req.AllowInternet = !spec.Closed
	create := func(ctx context.Context) error { _, err := c.CreateSandbox(ctx, req); return err }
	if spec.Fail {
		return failMain(c, create)
	}
	if err := create(context.Background()); err != nil {
		return 4
	}
	return 0
}

// failMain runs do, which a failpoint makes fail, and checks in the
// failing process (before any Reconcile could tidy up) that the failed
// run's undo left nothing behind.
func failMain(c *Cubelet, do func(context.Context) error) int {
	if err := do(context.Background()); err == nil || !strings.Contains(err.Error(), "failpoint") {
		fmt.Fprintf(os.Stderr, "want a failpoint's error, got %v\n", err)
		return 6
	}
	left, err := leftovers(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 7
	}
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "failed run left: %q\n", left)
		return 8
	}
	return 0
}

// crashPoolMain runs in a child process: a cubelet whose warm pool makes a
// slot, with a failpoint that SIGKILLs it at one slot step.
func crashPoolMain([]string) int {
	if _, _, err := childCubelet(); err != nil {
		return 3
	}
	time.Sleep(30 * time.Second)
	return 0
}

func crashKillMain([]string) int {
	c, spec, err := childCubelet()
	if err != nil {
		return 3
	}
	if err := c.KillSandbox(context.Background(), spec.ID); err != nil {
		return 4
	}
	return 0
}

// runCrashChild runs the test binary as a cubelet that crashes at failpoint
// step and asserts it really died of SIGKILL (so the failpoint fired).
func runCrashChild(t *testing.T, n *node, mode, id, step string) {
	t.Helper()
	runCrashChildSpec(t, n, mode, n.crashSpec(crashSpec{ID: id}), step)
}

func runCrashChildSpec(t *testing.T, n *node, mode, spec, step string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], mode)
	cmd.Env = append(os.Environ(), crashEnv+"="+spec, failpoint.EnvVar+"="+step+"=kill")
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child %s at %s: expected SIGKILL, got %v", mode, step, err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child %s at %s: expected SIGKILL, got %v", mode, step, err)
	}
}

// createFailpoints lists the failpoints a create of createReq (closed:
// without internet) fires on a test node, resuming from a slot at stage
// (-1: a cold create), in order: the create pipeline's plan.
func createFailpoints(stage int, closed bool) []string {
	b := &build{c: &Cubelet{}, kind: "create",
		rec: nodestore.Sandbox{AllowInternet: !closed, DiskSizeMB: template.DefaultDiskSizeMB}}
	if stage >= 0 {
		b.from = &poolSlot{stage: stage, rec: nodestore.Sandbox{DiskSizeMB: poolDiskSizeMB}}
	}
	return b.failpoints(stepRunning)
}

// TestCrashDuringCreate kills the cubelet with SIGKILL at every boundary of
// the create pipeline, on each path (cold, plain slot, pre-started slot,
// and a pre-started slot whose egress policy must change), restarts it and
// asserts: the interrupted sandbox is fully running or fully gone, nothing
// is orphaned, and the same id is created again at once.
func TestCrashDuringCreate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pool     int
		prestart bool
		closed   bool
		steps    []string
	}{
		{"cold", 0, false, false, createFailpoints(-1, false)},
		{"plain-slot", 2, false, false, createFailpoints(stagePlain, false)},
		{"prestarted", 2, true, false, createFailpoints(stagePrestarted, false)},
		// Only the boundary the open create does not reach.
		{"prestarted-closed", 2, true, true, []string{"create/after-egress"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crashDuringCreate(t, tc.pool, tc.prestart, tc.closed, tc.steps)
		})
	}
}

func crashDuringCreate(t *testing.T, poolSize int, prestart, closed bool, steps []string) {
	n := newTestNode(t)
	n.cfg.PoolSize = poolSize
	n.cfg.PoolPrestart = prestart
	for _, step := range steps {
		t.Run(strings.ReplaceAll(step, "/", "-"), func(t *testing.T) {
			// Short: the shim's socket path in the state dir named by it
			// must fit sun_path (108 bytes) under the test's temp dir.
			id := "crash-" + step[strings.LastIndex(step, "after-")+len("after-"):]
			runCrashChildSpec(t, n, "cubelet-create", n.crashSpec(crashSpec{ID: id, Closed: closed}), step)
			c := n.start(t)
			defer c.Close()
			ctx := context.Background()
			if rec, err := c.store.Get(id); err == nil {
				if poolSize > 0 && !isSlot(rec.Runtime()) {
					t.Fatalf("sandbox did not come from a slot: %+v", rec)
				}
				if err := envdHealthy(t, c, id); err != nil {
					t.Fatalf("interrupted sandbox kept but not running: %v", err)
				}
				assertClean(t, c, id)
				if err := c.KillSandbox(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			assertClean(t, c)
			if _, err := c.CreateSandbox(ctx, createReq(id)); err != nil {
				t.Fatalf("re-create after crash: %v", err)
			}
			if err := envdHealthy(t, c, id); err != nil {
				t.Fatal(err)
			}
			if err := c.KillSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCrashDuringSlot kills the cubelet at every step of making a
// pre-started pool slot; after a restart the half-made slot must be fully
// gone (no sandbox, endpoint, state dir or cgroup of it) and creates work.
func TestCrashDuringSlot(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 1
	b := &build{c: &Cubelet{}, kind: "slot", ahead: true, rec: nodestore.Sandbox{DiskSizeMB: template.DefaultDiskSizeMB}}
	for _, step := range b.failpoints(stagePrestarted) {
		t.Run(strings.TrimPrefix(step, "slot/"), func(t *testing.T) {
			runCrashChild(t, n, "cubelet-pool", "", step)
			cfg := n.cfg
			cfg.PoolSize = 0
			c, err := New(context.Background(), cfg, n.templates)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if recs, _ := c.store.List(); len(recs) != 0 || c.PoolSize() != 0 {
				t.Fatalf("half-made slot kept: %+v", recs)
			}
			assertClean(t, c)
			id := "after-slot-" + strings.TrimPrefix(step, "slot/after-")
			if _, err := c.CreateSandbox(context.Background(), createReq(id)); err != nil {
				t.Fatal(err)
			}
			if err := envdHealthy(t, c, id); err != nil {
				t.Fatal(err)
			}
			if err := c.KillSandbox(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			assertClean(t, c)
		})
	}
}

// TestCrashDuringDestroy kills the cubelet at every destroy step; after a
// restart the sandbox must be fully gone with no orphans.
func TestCrashDuringDestroy(t *testing.T) {
	n := newTestNode(t)
	for _, step := range DestroySteps {
		t.Run(step, func(t *testing.T) {
			id := "gone-" + step
			c := n.start(t)
			if _, err := c.CreateSandbox(context.Background(), createReq(id)); err != nil {
				t.Fatal(err)
			}
			c.Close()
			runCrashChild(t, n, "cubelet-kill", id, "destroy/"+step)
			c = n.start(t)
			defer c.Close()
			assertClean(t, c)
		})
	}
}

// TestFailedCreateUndoes makes each step of the create pipeline fail (on
// each path), and each step of making a slot, and checks in the failing
// cubelet that the run's undo removed everything it made, the slot's
// steps included once a create had taken it over.
func TestFailedCreateUndoes(t *testing.T) {
	n := newTestNode(t)
	for _, tc := range []struct {
		name     string
		pool     int
		prestart bool
		steps    []string
	}{
		{"cold", 0, false, createFailpoints(-1, false)},
		{"plain-slot", 2, false, createFailpoints(stagePlain, false)},
		{"prestarted", 2, true, createFailpoints(stagePrestarted, false)},
	} {
		for _, step := range tc.steps {
			t.Run(tc.name+"/"+strings.ReplaceAll(strings.TrimPrefix(step, "create/"), "/", "-"), func(t *testing.T) {
				n.cfg.PoolSize, n.cfg.PoolPrestart = tc.pool, tc.prestart
				runFailChild(t, n, "cubelet-create", crashSpec{ID: "failed", Fail: true}, step)
			})
		}
	}
	n.cfg.PoolSize = 0
	b := &build{c: &Cubelet{}, kind: "slot", ahead: true, rec: nodestore.Sandbox{DiskSizeMB: template.DefaultDiskSizeMB}}
	for _, prestart := range []bool{false, true} {
		n.cfg.PoolPrestart = prestart
		last := stagePlain
		if prestart {
			last = stagePrestarted
		}
		for _, step := range b.failpoints(last) {
			t.Run(fmt.Sprintf("slot-prestart=%v/%s", prestart, strings.TrimPrefix(step, "slot/")), func(t *testing.T) {
				runFailChild(t, n, "cubelet-create", crashSpec{Fail: true}, step)
			})
		}
	}
	c := n.start(t)
	defer c.Close()
	assertClean(t, c)
	if _, err := c.CreateSandbox(context.Background(), createReq("after-failures")); err != nil {
		t.Fatal(err)
	}
	if err := envdHealthy(t, c, "after-failures"); err != nil {
		t.Fatal(err)
	}
}

// runFailChild runs the test binary as a cubelet whose failpoint step
// returns an error, and asserts that the child found nothing left behind.
func runFailChild(t *testing.T, n *node, mode string, spec crashSpec, step string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], mode)
	cmd.Env = append(os.Environ(), crashEnv+"="+n.crashSpec(spec), failpoint.EnvVar+"="+step+"=error")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s failing at %s: %v\n%s", mode, step, err, out)
	}
}
