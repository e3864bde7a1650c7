package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/failpoint"
	"github.com/cube-dev/cube/internal/template"
)

// crashEnv carries a test node's config into a child cubelet process.
const crashEnv = "CUBE_TEST_NODE"

type crashSpec struct {
	Cfg       Config `json:"cfg"`
	Templates string `json:"templates"`
	ID        string `json:"id"`
}

func (n *node) crashSpec(id string) string {
	cfg := n.cfg
	cfg.Logger = nil
	b, _ := json.Marshal(crashSpec{Cfg: cfg, Templates: n.templates.Dir, ID: id})
	return string(b)
}

func childCubelet() (*Cubelet, string, error) {
	var s crashSpec
	if err := json.Unmarshal([]byte(os.Getenv(crashEnv)), &s); err != nil {
		return nil, "", err
	}
	s.Cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := New(context.Background(), s.Cfg, &template.Registry{Dir: s.Templates})
	return c, s.ID, err
}

// crashCreateMain runs in a child process: create a sandbox with failpoints
// from the environment (which SIGKILL the process at one step).
func crashCreateMain([]string) int {
	c, id, err := childCubelet()
	if err != nil {
		return 3
	}
	// With a warm pool, crash on the pool path: wait for a ready slot.
	for deadline := time.Now().Add(20 * time.Second); c.cfg.PoolSize > 0 && c.PoolSize() == 0; {
		if time.Now().After(deadline) {
			return 5
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.CreateSandbox(context.Background(), createReq(id)); err != nil {
		return 4
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
	c, id, err := childCubelet()
	if err != nil {
		return 3
	}
	if err := c.KillSandbox(context.Background(), id); err != nil {
		return 4
	}
	return 0
}

// runCrashChild runs the test binary as a cubelet that crashes at step and
// asserts it really died of SIGKILL.
func runCrashChild(t *testing.T, n *node, mode, id, step string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], mode)
	cmd.Env = append(os.Environ(), crashEnv+"="+n.crashSpec(id), failpoint.EnvVar+"="+step+"=kill")
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

// TestCrashDuringCreate kills the cubelet with SIGKILL at every create step,
// restarts it and asserts: the interrupted sandbox is fully running or fully
// gone, nothing is orphaned, and the same id is created again at once.
func TestCrashDuringCreate(t *testing.T) {
	for _, tc := range []struct {
		pool     int
		prestart bool
		steps    []string
	}{{0, false, CreateSteps}, {2, false, CreateSteps}, {2, true, SlotCreateSteps}} {
		name := fmt.Sprintf("pool=%d", tc.pool)
		if tc.prestart {
			name += "-prestarted"
		}
		t.Run(name, func(t *testing.T) {
			crashDuringCreate(t, tc.pool, tc.prestart, tc.steps)
		})
	}
}

func crashDuringCreate(t *testing.T, poolSize int, prestart bool, steps []string) {
	n := newTestNode(t)
	n.cfg.PoolSize = poolSize
	n.cfg.PoolPrestart = prestart
	for _, step := range steps {
		t.Run(step, func(t *testing.T) {
			id := "crash-" + step
			runCrashChild(t, n, "cubelet-create", id, "create/"+step)
			c := n.start(t)
			defer c.Close()
			ctx := context.Background()
			if rec, err := c.store.Get(id); err == nil {
				if prestart && !isSlot(rec.RuntimeID) {
					t.Fatalf("sandbox did not come from a pre-started slot: %+v", rec)
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
	for _, step := range SlotSteps {
		t.Run(step, func(t *testing.T) {
			runCrashChild(t, n, "cubelet-pool", "", "slot/"+step)
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
			id := "after-slot-" + step
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
