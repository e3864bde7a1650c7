package cubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/sandboxlog"
)

// waitLog polls the log of sandbox id until a line satisfies ok.
func waitLog(t *testing.T, c *Cubelet, id string, what string, ok func(nodeproto.LogEntry) bool) nodeproto.LogEntry {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		es, err := c.SandboxLogs(context.Background(), id, nodeproto.LogQuery{Limit: nodeproto.MaxLogLimit})
		for _, e := range es {
			if ok(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no such line in the log of %s after 15s (%v): %+v", what, id, err, es)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func msgIs(msg string) func(nodeproto.LogEntry) bool {
	return func(e nodeproto.LogEntry) bool { return e.Message == msg }
}

// A sandbox's log has envd's lines and the node's, keeps the lines envd
// wrote while the agent was down, and says how the sandbox ended: killed,
// or died with envd's end, after the sandbox is gone.
func TestSandboxLogsAcrossRestartAndDeath(t *testing.T) {
	n := newTestNode(t)
	n.cfg.MaintainInterval = 100 * time.Millisecond
	c := n.start(t)
	ctx := context.Background()
	for _, id := range []string{"logged", "doomed"} {
		if _, err := c.CreateSandbox(ctx, createReq(id)); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(c.sandboxDir("logged"), sandboxlog.PipeFile)); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("log pipe: %v", err)
	}
	waitLog(t, c, "logged", "created", func(e nodeproto.LogEntry) bool {
		return e.Message == "sandbox created" && e.Logger == "cubelet" && e.Fields["template"] == "tiny"
	})
	waitLog(t, c, "logged", "envd start", func(e nodeproto.LogEntry) bool { return e.Logger == "envd" && e.Message == "envd listening" })
	sandboxRun(ctx, t, c, "logged", "", "echo one")
	waitLog(t, c, "logged", "process ended", func(e nodeproto.LogEntry) bool {
		return e.Logger == "process" && e.Message == "process ended" && e.Fields["exitCode"] == "0"
	})

	// The agent goes away; envd keeps logging into the pipe; the next agent
	// reads on.
	c.Close()
	c2 := n.start(t)
	sandboxRun(ctx, t, c2, "logged", "", "echo during-restart-check")
	waitLog(t, c2, "logged", "process after restart", func(e nodeproto.LogEntry) bool {
		return e.Message == "process started" && strings.Contains(e.Fields["args"], "during-restart-check")
	})
	if err := c2.PauseSandbox(ctx, "logged"); err != nil {
		t.Fatal(err)
	}
	if err := c2.ResumeSandbox(ctx, "logged"); err != nil {
		t.Fatal(err)
	}
	waitLog(t, c2, "logged", "paused", msgIs("sandbox paused"))
	waitLog(t, c2, "logged", "resumed", msgIs("sandbox resumed"))

	// Killed by the timeout: the reason travels in the context.
	if err := c2.KillSandbox(nodeproto.WithKillReason(ctx, nodeproto.KillReasonTimeout), "logged"); err != nil {
		t.Fatal(err)
	}
	waitLog(t, c2, "logged", "killed", func(e nodeproto.LogEntry) bool {
		return e.Message == "sandbox killed: "+nodeproto.KillReasonTimeout && e.Level == "info"
	})

	// Died: kill -9 envd (pid 1, the reaper, ends with it).
	sb, err := nsrt.Attach(ctx, c2.sandboxDir("doomed"))
	if err != nil {
		t.Fatal(err)
	}
	envdPID := childOf(t, sb.InitPID())
	sb.Close()
	if err := syscall.Kill(envdPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	died := waitLog(t, c2, "doomed", "died", func(e nodeproto.LogEntry) bool {
		return strings.HasPrefix(e.Message, "sandbox died unexpectedly: its init (envd) ended with")
	})
	if died.Level != "error" || died.Fields["exitCode"] != "137" || !strings.Contains(died.Message, "SIGKILL") {
		t.Errorf("died line %+v", died)
	}
	// The line is written first in the teardown; wait for the rest.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := c2.store.Get("doomed"); errors.Is(err, errdefs.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dead sandbox not removed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Both logs outlive their sandboxes, and another restart.
	c2.Close()
	c3 := n.start(t)
	for _, id := range []string{"logged", "doomed"} {
		if es, err := c3.SandboxLogs(ctx, id, nodeproto.LogQuery{}); err != nil || len(es) < 3 {
			t.Errorf("log of ended %s after restart: %v %d lines", id, err, len(es))
		}
	}
	if _, err := c3.SandboxLogs(ctx, "never", nodeproto.LogQuery{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	assertClean(t, c3)
}

// childOf returns the first child of pid.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if f := strings.Fields(string(b)); len(f) > 0 {
			c, err := strconv.Atoi(f[0])
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("no child of pid %d", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
