package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
)

// withStartCmd gives template name of n the start and ready commands (as
// a template build records them in template.json).
func withStartCmd(t *testing.T, n *node, name, start, ready string) {
	t.Helper()
	setStartCmd(t, n.templates, name, start, ready)
}

// setStartCmd gives template name of reg the start and ready commands.
func setStartCmd(t testing.TB, reg *template.Registry, name, start, ready string) {
	t.Helper()
	path := filepath.Join(reg.Dir, name, "template.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	meta["defaults"] = template.Defaults{StartCmd: start, ReadyCmd: ready}
	if b, err = json.Marshal(meta); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStartCommand: a template's start command runs in every sandbox made
// from it, cold or from a plain slot, and the create returns only once its
// ready command succeeded; the process keeps running after the create.
func TestStartCommand(t *testing.T) {
	needRoot(t)
	n := newTestNode(t)
	withStartCmd(t, n, "tiny", "sleep 0.3; echo up > /tmp/started; exec sleep 1000", "test -f /tmp/started")
	n.cfg.PoolSize = 1
	n.cfg.PoolPrestart = false // a plain slot, then cold creates
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	for _, id := range []string{"from-slot", "cold"} {
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, createReq(id))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		took := time.Since(start)
		rec, _ := c.store.Get(sb.ID)
		pid, _ := c.slotProcs(ctx, rec.Runtime())
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/root/tmp/started")
		if err != nil || strings.TrimSpace(string(b)) != "up" {
			t.Fatalf("%s: create returned before the ready command passed (after %v): %q %v", id, took, b, err)
		}
		if took < 300*time.Millisecond {
			t.Errorf("%s: create took %v, less than the start command's own delay", id, took)
		}
		if err := envdHealthy(t, c, sb.ID); err != nil {
			t.Fatalf("%s: envd after the start: %v", id, err)
		}
	}
}

// TestStartCommandFailures: a ready command that never passes fails the
// create within the bound, and a start command that exits fails it at
// once with its output; either way nothing of the sandbox is left.
func TestStartCommandFailures(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name, start, ready, want string
		maxTook                  time.Duration
	}{
		{"never ready", "exec sleep 1000", "false", "did not succeed within", 10 * time.Second},
		{"start exits", "echo boom-output; exit 3", "test -f /nope", "boom-output", 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t)
			withStartCmd(t, n, "tiny", tc.start, tc.ready)
			n.cfg.StartTimeout = 2 * time.Second
			c := n.start(t)
			start := time.Now()
			_, err := c.CreateSandbox(context.Background(), createReq("s1"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v; want an error containing %q", err, tc.want)
			}
			if took := time.Since(start); took > tc.maxTook {
				t.Errorf("failed after %v, want within %v", took, tc.maxTook)
			}
			if _, err := c.store.Get("s1"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("record left after the failed create: %v", err)
			}
			if sbs, _ := c.Sandboxes(context.Background()); len(sbs) != 0 {
				t.Errorf("sandboxes left: %+v", sbs)
			}
		})
	}
}
