package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/template"
)

// TestCreatePlan is the pipeline's decision of which steps run: all of
// them on a cold create, the slot's stage skipped when resuming from a slot
// unless the slot's result does not fit the sandbox (egress policy, disk
// size), personalise only after a launch done ahead of time, and a slot
// made ahead of time stops at its stage.
func TestCreatePlan(t *testing.T) {
	const disk = template.DefaultDiskSizeMB
	sandbox := func(open bool, diskMB int) nodestore.Sandbox {
		return nodestore.Sandbox{AllowInternet: open, DiskSizeMB: diskMB}
	}
	slot := func(stage int) *poolSlot {
		return &poolSlot{stage: stage, rec: nodestore.Sandbox{DiskSizeMB: disk}}
	}
	for _, tc := range []struct {
		name   string
		noDisk bool
		b      build
		last   int
		want   string
	}{
		{"cold", false, build{rec: sandbox(true, disk)}, stepRunning,
			"reserve network egress disk launch map running"},
		{"cold without disk limit", true, build{rec: sandbox(true, disk)}, stepRunning,
			"reserve network egress launch map running"},
		{"plain slot", false, build{rec: sandbox(true, disk), from: slot(stagePlain)}, stepRunning,
			"reserve launch map running"},
		{"plain slot, no internet", false, build{rec: sandbox(false, disk), from: slot(stagePlain)}, stepRunning,
			"reserve egress launch map running"},
		{"plain slot, other disk size", false, build{rec: sandbox(true, 2*disk), from: slot(stagePlain)}, stepRunning,
			"reserve disk launch map running"},
		{"pre-started slot", false, build{rec: sandbox(true, disk), from: slot(stagePrestarted)}, stepRunning,
			"reserve personalise map running"},
		{"pre-started slot, no internet", false, build{rec: sandbox(false, disk), from: slot(stagePrestarted)}, stepRunning,
			"reserve egress personalise map running"},
		{"making a plain slot", false, build{ahead: true, rec: nodestore.Sandbox{DiskSizeMB: disk}}, stagePlain,
			"reserve network egress disk"},
		{"making a plain slot without disk limit", true, build{ahead: true, rec: nodestore.Sandbox{DiskSizeMB: disk}}, stagePlain,
			"reserve network egress"},
		{"making a pre-started slot", false, build{ahead: true, rec: nodestore.Sandbox{DiskSizeMB: disk}}, stagePrestarted,
			"reserve network egress disk launch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			b.c = &Cubelet{cfg: Config{NoDiskLimit: tc.noDisk}}
			var got []string
			for _, i := range b.plan(tc.last) {
				got = append(got, createSteps[i].name)
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("plan %q, want %q", strings.Join(got, " "), tc.want)
			}
		})
	}
}

// TestFailpointNames: each step that runs fires a failpoint named after it,
// the personalise step's parts too, in pipeline order (here a create from a
// pre-started slot whose egress policy, no internet, is not the slot's).
func TestFailpointNames(t *testing.T) {
	b := &build{c: &Cubelet{}, kind: "create", rec: nodestore.Sandbox{DiskSizeMB: 1},
		from: &poolSlot{stage: stagePrestarted, rec: nodestore.Sandbox{DiskSizeMB: 1}}}
	got := b.failpoints(stepRunning)
	want := []string{"create/after-reserve", "create/after-egress",
		"create/personalise/after-hostname", "create/personalise/after-files", "create/personalise/after-envd",
		"create/personalise/after-limits", "create/after-personalise", "create/after-map", "create/after-running"}
	if !slices.Equal(got, want) {
		t.Fatalf("failpoints %q, want %q", got, want)
	}
}

// TestSlotStages: a slot's stage is recorded by step name and read back;
// a slot file without one (an earlier version's), with an unknown one (a
// later version's) or with a step only a sandbox runs has none.
func TestSlotStages(t *testing.T) {
	for _, st := range []int{stagePlain, stagePrestarted} {
		if got, ok := slotStage(createSteps[st].name); !ok || got != st {
			t.Errorf("stage %d read back as %d, %v", st, got, ok)
		}
	}
	if stagePrestarted <= stagePlain || !(poolSlot{stage: stagePrestarted}).prestarted() || (poolSlot{stage: stagePlain}).prestarted() {
		t.Error("stage order")
	}
	for _, name := range []string{"", "warp", "personalise", "running"} {
		if _, ok := slotStage(name); ok {
			t.Errorf("stage %q accepted", name)
		}
	}
}

// TestPreviousVersionRecords: what the previous cubelet left on a node is
// adopted, killed and cleaned up: a sandbox record without RuntimeID whose
// runtime objects carry the sandbox's id (its cold creates, and plain pool
// slots, which it renamed at take), a sandbox with RuntimeID naming the
// pre-started slot it came from, and a ready slot whose file records no
// stage (recycled: its plain slots kept their disk elsewhere). The
// sandboxes survive a lost node store too (rebuilt from their state dirs).
func TestPreviousVersionRecords(t *testing.T) {
	n := newTestNode(t)
	c := n.start(t)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, createReq("old-cold")); err != nil {
		t.Fatal(err)
	}
	// The previous version's record: no RuntimeID (omitted from the JSON).
	rec, err := c.store.Get("old-cold")
	if err != nil || rec.RuntimeID != "old-cold" {
		t.Fatalf("cold record %+v, %v: RuntimeID not set by reserve", rec, err)
	}
	rec.RuntimeID = ""
	if err := c.putRecord(rec); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(c.sandboxDir("old-cold"), recordFile))
	if strings.Contains(string(data), "runtimeID") {
		t.Fatalf("old-style record copy still names a runtime: %s", data)
	}
	c.Close()

	n.cfg.PoolSize = 1
	c = n.start(t)
	waitPool(t, c, 1)
	if _, err := c.CreateSandbox(ctx, createReq("old-slot")); err != nil {
		t.Fatal(err)
	}
	if rec, err := c.store.Get("old-slot"); err != nil || !isSlot(rec.RuntimeID) {
		t.Fatalf("record %+v, %v: not made from a slot", rec, err)
	}
	waitPool(t, c, 1)
	slot := readySlots(c)[0]
	c.Close()
	// The ready slot's file as the previous version wrote it: no stage.
	var f map[string]any
	data, err = os.ReadFile(c.slotFilePath(slot.rec.ID))
	if err != nil || json.Unmarshal(data, &f) != nil || f["stage"] != "launch" {
		t.Fatalf("slot file %s: %v", data, err)
	}
	delete(f, "stage")
	data, _ = json.Marshal(f)
	if err := os.WriteFile(c.slotFilePath(slot.rec.ID), data, 0o600); err != nil {
		t.Fatal(err)
	}

	n.cfg.PoolSize = 0
	for _, lostStore := range []bool{false, true} {
		if lostStore {
			if err := os.Remove(filepath.Join(n.cfg.StateDir, "node.db")); err != nil {
				t.Fatal(err)
			}
		}
		c = n.start(t)
		if _, err := c.store.Get(slot.rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("slot without a stage kept (%v)", err)
		}
		for _, id := range []string{"old-cold", "old-slot"} {
			if err := envdHealthy(t, c, id); err != nil {
				t.Fatalf("%s (lost store %v): %v", id, lostStore, err)
			}
		}
		if rec, _ := c.store.Get("old-cold"); rec.Runtime() != "old-cold" {
			t.Fatalf("old-cold adopted as %+v", rec)
		}
		assertClean(t, c, "old-cold", "old-slot")
		c.Close()
	}
	c = n.start(t)
	defer c.Close()
	for _, id := range []string{"old-cold", "old-slot"} {
		if err := c.KillSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(c.sandboxDir(slot.rec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("recycled slot's state dir left: %v", err)
	}
	assertClean(t, c)
}
