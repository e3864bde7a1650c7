package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/template"
)

// Start commands in warm-pool slots (poolstart.go).

// startMarkerCmd writes /tmp/started once up, naming the FOO it sees (a
// create's envVars must not reach it), then keeps running.
const (
	startMarkerCmd   = `sleep 1; echo "up FOO=$FOO" > /tmp/started; exec sleep 1000`
	startMarkerReady = "test -f /tmp/started"
	startMarkerDelay = time.Second
)

// markerIn reads /tmp/started in the sandbox of record rec, with its mtime.
func markerIn(t *testing.T, c *Cubelet, rec nodestore.Sandbox) (string, time.Time) {
	t.Helper()
	pid, _ := c.slotProcs(context.Background(), rec.Runtime())
	path := "/proc/" + strconv.Itoa(pid) + "/root/tmp/started"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("marker of %s: %v", rec.ID, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b)), st.ModTime()
}

// envVarsOf reads the env vars envd of sandbox id gives its processes.
func envVarsOf(t *testing.T, c *Cubelet, id string) map[string]string {
	t.Helper()
	code, body := envdGet(t, c, id, "/envs", "tok")
	var env map[string]string
	if err := json.Unmarshal(body, &env); code != 200 || err != nil {
		t.Fatalf("envd /envs of %s: %d %s %v", id, code, body, err)
	}
	return env
}

// TestStartedSlot: a pre-started slot of a template with a start command
// runs the start command and passed its ready command when it is made; a
// create, with envVars, takes it and returns without the start's delay, the
// marker older than the create, the start command without the create's env
// vars and envd with them. A cold create gives the start command the same
// env (the template's only).
func TestStartedSlot(t *testing.T) {
	n := newTestNode(t)
	withStartCmd(t, n, "tiny", startMarkerCmd, startMarkerReady)
	n.cfg.PoolSize = 1
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	slot := readySlots(c)[0]
	if slot.stage != stageStarted || slot.started == "" {
		t.Fatalf("slot at stage %s (started %q), want %s", createSteps[slot.stage].name, slot.started, createSteps[stageStarted].name)
	}
	if f, err := c.readSlotFile(slot.rec.ID); err != nil || f.Stage != "start" || f.StartCmd != slot.started {
		t.Fatalf("slot file %+v, %v", f, err)
	}

	begin := time.Now()
	req := createReq("from-slot")
	req.EnvVars = map[string]string{"FOO": "create"}
	if _, err := c.CreateSandbox(ctx, req); err != nil {
		t.Fatal(err)
	}
	took := time.Since(begin)
	rec, _ := c.store.Get("from-slot")
	if rec.RuntimeID != slot.rec.ID {
		t.Fatalf("create did not take the started slot: runtime %s, slot %s", rec.RuntimeID, slot.rec.ID)
	}
	if took >= startMarkerDelay {
		t.Errorf("create from a started slot took %v, at least the start command's own delay", took)
	}
	marker, at := markerIn(t, c, rec)
	if marker != "up FOO=" {
		t.Errorf("start command in a slot saw %q, want the template's env only", marker)
	}
	if !at.Before(begin) {
		t.Errorf("marker written at %v, not before the create began at %v", at, begin)
	}
	if env := envVarsOf(t, c, "from-slot"); env["FOO"] != "create" {
		t.Errorf("envd env after take: %v", env)
	}
	t.Logf("create from a started slot: %v", took)

	// Cold: the same env semantics, and the create waits for the start.
	c.stopPool()
	c.DrainPool(ctx)
	begin = time.Now()
	req = createReq("cold")
	req.EnvVars = map[string]string{"FOO": "create"}
	if _, err := c.CreateSandbox(ctx, req); err != nil {
		t.Fatal(err)
	}
	took = time.Since(begin)
	rec, _ = c.store.Get("cold")
	if rec.RuntimeID != "cold" || took < startMarkerDelay {
		t.Fatalf("cold create: runtime %s, took %v", rec.RuntimeID, took)
	}
	if marker, _ := markerIn(t, c, rec); marker != "up FOO=" {
		t.Errorf("start command on a cold create saw %q, want the template's env only", marker)
	}
	if env := envVarsOf(t, c, "cold"); env["FOO"] != "create" {
		t.Errorf("envd env after a cold create: %v", env)
	}
	t.Logf("cold create: %v", took)
}

// TestStartedSlotFailure: a start command that fails in a slot leaves no
// slot (nor its record or sandbox), backs the target off, and a create
// still reports the start command's failure.
func TestStartedSlotFailure(t *testing.T) {
	n := newTestNode(t)
	withStartCmd(t, n, "tiny", "echo boom-output; exit 3", "test -f /nope")
	n.cfg.PoolSize = 1
	n.cfg.StartTimeout = 2 * time.Second
	c := n.start(t)
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.pool.mu.Lock()
		fails, until := c.pool.startFails[mainTarget], c.pool.missing[mainTarget]
		c.pool.mu.Unlock()
		if fails > 0 {
			if until.Before(time.Now()) {
				t.Errorf("target not backed off: skipped until %v", until)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no slot start failure noted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c.PoolSize() != 0 {
		t.Fatalf("pool has %d slots after the start command failed", c.PoolSize())
	}
	// The failed slot was undone before the failure was noted, and the
	// backoff (5 s) holds the next try.
	if recs, _ := c.store.List(); len(recs) != 0 {
		t.Errorf("records left by the failed slot: %+v", recs)
	}
	assertClean(t, c)
	_, err := c.CreateSandbox(ctx, createReq("s1"))
	if err == nil || !strings.Contains(err.Error(), "boom-output") {
		t.Fatalf("create: %v; want the start command's failure", err)
	}
	if _, err := c.store.Get("s1"); err == nil {
		t.Error("record of the failed create left")
	}
}

// TestStartedSlotRestart: a started slot is adopted after a cubelet
// restart and a create takes it without the start's delay; a started slot
// whose ready command fails by the time it is taken is dropped and the
// create starts the command itself.
func TestStartedSlotRestart(t *testing.T) {
	n := newTestNode(t)
	withStartCmd(t, n, "tiny", startMarkerCmd, startMarkerReady)
	n.cfg.PoolSize = 1
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	slot := readySlots(c)[0]
	c.Close()

	c = n.start(t)
	got := readySlots(c)
	if len(got) != 1 || got[0].rec.ID != slot.rec.ID || got[0].stage != stageStarted || got[0].started != slot.started {
		t.Fatalf("slots after restart %+v, want %+v adopted", got, slot)
	}
	begin := time.Now()
	if _, err := c.CreateSandbox(ctx, createReq("after")); err != nil {
		t.Fatal(err)
	}
	took := time.Since(begin)
	rec, _ := c.store.Get("after")
	if rec.RuntimeID != slot.rec.ID || took >= startMarkerDelay {
		t.Fatalf("create after restart: runtime %s (slot %s), took %v", rec.RuntimeID, slot.rec.ID, took)
	}
	if _, at := markerIn(t, c, rec); !at.Before(begin) {
		t.Errorf("marker written at %v, after the create began at %v", at, begin)
	}

	// The next slot's start command "dies" (its marker goes) while the
	// cubelet is down: the take's ready check drops the slot.
	waitPool(t, c, 1)
	slot = readySlots(c)[0]
	c.Close()
	if err := os.Remove(filepath.Join("/proc", strconv.Itoa(slot.initPID), "root/tmp/started")); err != nil {
		t.Fatal(err)
	}
	c = n.start(t)
	if got := readySlots(c); len(got) != 1 || got[0].rec.ID != slot.rec.ID {
		t.Fatalf("slots after restart %+v, want %s adopted", got, slot.rec.ID)
	}
	begin = time.Now()
	if _, err := c.CreateSandbox(ctx, createReq("unready")); err != nil {
		t.Fatal(err)
	}
	took = time.Since(begin)
	rec, _ = c.store.Get("unready")
	if rec.RuntimeID == slot.rec.ID {
		t.Fatalf("create took the slot whose ready command fails")
	}
	if took < startMarkerDelay {
		t.Errorf("create took %v, less than the start command's delay: it did not start it", took)
	}
	if marker, at := markerIn(t, c, rec); marker != "up FOO=" || at.Before(begin) {
		t.Errorf("marker %q at %v, want written by this create (began %v)", marker, at, begin)
	}
	waitPool(t, c, 1) // the dropped slot is gone, a new one made
	assertClean(t, c, "after", "unready")
}

// TestSlotStartBackoff: the backoff doubles per failure in a row, bounded.
func TestSlotStartBackoff(t *testing.T) {
	var got []time.Duration
	for i := 1; i <= 9; i++ {
		got = append(got, slotStartBackoff(i))
	}
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	if !slices.Equal(got, want) {
		t.Fatalf("backoff %v, want %v", got, want)
	}
}

// TestStartedSlotFits: a started slot fits only a template with the same
// start and ready commands; a plain pre-started slot fits only one
// without a start command; a slot of the template whose commands changed
// is set aside as stale.
func TestStartedSlotFits(t *testing.T) {
	tmpl := func(start, ready string) template.Template {
		t := template.Template{Name: "app", Digest: "sha256:1", DiskSizeMB: 10}
		if start != "" {
			t.Defaults = &template.Defaults{StartCmd: start, ReadyCmd: ready}
		}
		return t
	}
	slot := func(tm template.Template) poolSlot {
		st := stagePrestarted
		if hasStartCmd(tm) {
			st = stageStarted
		}
		return poolSlot{rec: nodestore.Sandbox{ID: "pool-1", Template: "app", DiskSizeMB: 10}, stage: st, digest: "sha256:1", started: startKey(tm)}
	}
	c := &Cubelet{}
	a, b, none := tmpl("serve", "check"), tmpl("serve", "check2"), tmpl("", "")
	for _, tc := range []struct {
		slot poolSlot
		tmpl template.Template
		want bool
	}{
		{slot(a), a, true}, {slot(a), b, false}, {slot(a), none, false}, {slot(none), a, false}, {slot(none), none, true},
	} {
		if got := c.slotFits(tc.slot, tc.tmpl); got != tc.want {
			t.Errorf("slot started %q for template %+v: fits %v, want %v", tc.slot.started, tc.tmpl.Defaults, got, tc.want)
		}
	}
	c.pool = pool{ready: []poolSlot{slot(a)}, kick: make(chan struct{}, 1)}
	if _, ok := c.takeSlot(b); ok || len(c.pool.stale) != 1 || len(c.pool.ready) != 0 {
		t.Fatalf("slot of changed start command: taken %v, stale %d, ready %d", ok, len(c.pool.stale), len(c.pool.ready))
	}
}

// TestStartedSlotPlan: making a slot of a start-command template runs the
// start step (no personalise); a create from it skips start; a cold create
// starts envd without the create's env vars.
func TestStartedSlotPlan(t *testing.T) {
	withCmd := template.Template{Defaults: &template.Defaults{StartCmd: "serve"}}
	plan := func(b build, last int) string {
		b.c = &Cubelet{cfg: Config{}}
		var got []string
		for _, i := range b.plan(last) {
			got = append(got, createSteps[i].name)
		}
		return strings.Join(got, " ")
	}
	disk := nodestore.Sandbox{DiskSizeMB: 1}
	for _, tc := range []struct {
		name string
		b    build
		last int
		want string
	}{
		{"making a started slot", build{ahead: true, tmpl: withCmd, rec: disk}, stageStarted, "reserve network egress disk launch start"},
		{"from a started slot", build{tmpl: withCmd, rec: nodestore.Sandbox{DiskSizeMB: 1, AllowInternet: true},
			from: &poolSlot{stage: stageStarted, rec: disk}}, stepRunning, "reserve personalise map running"},
		{"cold", build{tmpl: withCmd, rec: disk}, stepRunning, "reserve network egress disk launch start map running"},
	} {
		if got := plan(tc.b, tc.last); got != tc.want {
			t.Errorf("%s: plan %q, want %q", tc.name, got, tc.want)
		}
	}
	if got, ok := slotStage("start"); !ok || got != stageStarted || !(poolSlot{stage: stageStarted}).prestarted() {
		t.Errorf("stage start read back as %d, %v", got, ok)
	}
	env := map[string]string{"A": "1"}
	if b := (&build{tmpl: withCmd, envVars: env}); b.launchEnvVars() != nil {
		t.Error("cold create of a start-command template launches envd with the create's env vars")
	}
	if b := (&build{envVars: env}); b.launchEnvVars()["A"] != "1" {
		t.Error("create without a start command lost its env vars at launch")
	}
}

// TestSlotStartFailedLocked: a start failure backs its target off for
// longer each time in a row; a made slot ends the run; other errors leave
// the target alone.
func TestSlotStartFailedLocked(t *testing.T) {
	c := &Cubelet{log: slog.New(slog.DiscardHandler), pool: pool{missing: map[string]time.Time{}}}
	fail := fmt.Errorf("make slot: %w: %w", errSlotStart, errors.New("exit 3"))
	for _, want := range []time.Duration{5 * time.Second, 10 * time.Second} {
		before := time.Now()
		if !c.slotStartFailedLocked("app", fail) {
			t.Fatal("start failure not noted")
		}
		if got := c.pool.missing["app"].Sub(before); got < want || got > want+time.Second {
			t.Errorf("skipped for %v, want %v", got, want)
		}
	}
	if c.slotStartFailedLocked("app", errors.New("no IP left")) || c.pool.startFails["app"] != 2 {
		t.Errorf("another error changed the run: %d", c.pool.startFails["app"])
	}
	if c.slotStartFailedLocked("app", nil) || c.pool.startFails["app"] != 0 {
		t.Errorf("a made slot did not end the run: %d", c.pool.startFails["app"])
	}
}
