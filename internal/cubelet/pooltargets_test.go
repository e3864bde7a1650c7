package cubelet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
)

// TestNextTarget is the refill's choice between the main target and the
// PoolTemplates ones: the target furthest below its size first (the main
// one on a tie), slots being made count, a target whose template was just
// found missing is skipped until its retry time, which is when the refill
// wakes.
func TestNextTarget(t *testing.T) {
	now := time.Now()
	pre := func(tmpl string) poolSlot {
		return poolSlot{rec: nodestore.Sandbox{Template: tmpl}, stage: stagePrestarted}
	}
	plain := poolSlot{stage: stagePlain}
	cfg := Config{PoolSize: 2, PoolPrestart: true, PoolTemplate: "base",
		PoolTemplates: []PoolTarget{{Template: "interp", Size: 2}, {Template: "off", Size: 0}}}
	for _, tc := range []struct {
		name     string
		ready    []poolSlot
		building map[string]int
		missing  map[string]time.Time
		wantKey  string
		wantNeed int
		wantWake bool
	}{
		{"empty: main first on a tie", nil, nil, nil, mainTarget, 4, false},
		{"main full", []poolSlot{pre("base"), plain}, nil, nil, "interp", 2, false},
		{"furthest below", []poolSlot{pre("base")}, nil, nil, "interp", 3, false},
		{"building counts", []poolSlot{pre("base"), pre("base")}, map[string]int{"interp": 2}, nil, "", 0, false},
		{"slot of a size-0 template counts for nobody", []poolSlot{pre("off"), pre("base"), pre("base")}, nil, nil, "interp", 2, false},
		{"missing template skipped", []poolSlot{pre("base"), pre("base")}, nil, map[string]time.Time{"interp": now.Add(time.Second)}, "", 0, true},
		{"missing template retried after its time", []poolSlot{pre("base"), pre("base")}, nil, map[string]time.Time{"interp": now.Add(-time.Second)}, "interp", 2, false},
		{"all full", []poolSlot{pre("base"), pre("base"), pre("interp"), pre("interp")}, nil, nil, "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cubelet{cfg: cfg, pool: pool{ready: tc.ready, building: tc.building, missing: tc.missing}}
			if tc.building == nil {
				c.pool.building = map[string]int{}
			}
			key, need, wake := c.nextTargetLocked(now)
			if need != tc.wantNeed || (need > 0 && key != tc.wantKey) || wake.IsZero() == tc.wantWake {
				t.Fatalf("got key %q need %d wake %v; want %q %d wake=%v", key, need, wake, tc.wantKey, tc.wantNeed, tc.wantWake)
			}
		})
	}
}

func TestValidatePoolTargets(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"none", Config{PoolSize: 4}, true},
		{"other template", Config{PoolSize: 4, PoolTemplates: []PoolTarget{{"code-interpreter-v1", 1}}}, true},
		{"main template again", Config{PoolSize: 4, PoolTemplates: []PoolTarget{{"base", 1}}}, false},
		{"main template with no main pool", Config{PoolTemplates: []PoolTarget{{"base", 1}}}, false},
		{"twice", Config{PoolTemplates: []PoolTarget{{"a", 1}, {"a", 2}}}, false},
		{"negative", Config{PoolTemplates: []PoolTarget{{"a", -2}}}, false},
		{"adaptive", Config{PoolTemplates: []PoolTarget{{"a", PoolAdaptive}}}, true},
		{"no name", Config{PoolTemplates: []PoolTarget{{"", 1}}}, false},
	} {
		err := validatePoolTargets(tc.cfg)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestPoolTemplatesSlot: a PoolTemplates target gets pre-started slots of
// its template once the template is on the node (not before, and without
// making plain slots for it), beside the main pool; a create of that
// template takes its slot (same runtime, personalised) and the pool makes
// another one.
func TestPoolTemplatesSlot(t *testing.T) {
	needRoot(t)
	n := newTestNode(t)
	n.cfg.PoolSize = 1
	n.cfg.PoolTemplates = []PoolTarget{{Template: "tiny2", Size: 1}}
	c := n.start(t)
	ctx := context.Background()
	waitPool(t, c, 1)
	time.Sleep(300 * time.Millisecond) // a slot for tiny2 would be under way by now
	if s := readySlots(c); len(s) != 1 || s[0].rec.Template != "tiny" {
		t.Fatalf("before tiny2 exists the pool has %+v, want one slot of tiny", s)
	}
	c.pool.mu.Lock()
	_, waiting := c.pool.missing["tiny2"]
	c.pool.mu.Unlock()
	if !waiting {
		t.Fatal("the refill did not note that tiny2 is missing")
	}

	if _, err := n.templates.ImportDir(ctx, "tiny2", busyboxRootfs(t)); err != nil {
		t.Fatal(err)
	}
	// Looked at again within poolTemplateRetry (no fetch tells it here).
	deadline := time.Now().Add(poolTemplateRetry + 30*time.Second)
	var slot poolSlot
	for slot.rec.ID == "" {
		for _, s := range readySlots(c) {
			if s.rec.Template == "tiny2" && s.prestarted() {
				slot = s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pre-started slot of tiny2: %+v", readySlots(c))
		}
		time.Sleep(50 * time.Millisecond)
	}
	req := createReq("from-tiny2")
	req.Template = "tiny2"
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.store.Get(sb.ID)
	if err != nil || rec.Runtime() != slot.rec.ID || rec.Template != "tiny2" {
		t.Fatalf("sandbox %+v (%v) did not come from slot %s", rec, err, slot.rec.ID)
	}
	if got := hostnameOf(t, slot.initPID); got != "from-tiny2" {
		t.Errorf("hostname %q", got)
	}
	// The pool makes another slot of tiny2 and keeps its tiny one.
	waitPool(t, c, 2)
	kinds := map[string]int{}
	for _, s := range readySlots(c) {
		kinds[s.rec.Template]++
	}
	if kinds["tiny"] != 1 || kinds["tiny2"] != 1 {
		t.Fatalf("pool after the take: %v", kinds)
	}
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPlainSlotsDroppedWhenPrestarting: plain slots left by a run without
// pre-started slots are dropped at start once the pool makes pre-started
// ones (they would be taken first and cost their create the launch); a
// create then resumes from a pre-started slot. Failed before: the plain
// slot was kept and taken (TestFailedCreateUndoes saw a create skip
// personalise under load).
func TestPlainSlotsDroppedWhenPrestarting(t *testing.T) {
	needRoot(t)
	n := newTestNode(t)
	n.cfg.PoolSize, n.cfg.PoolPrestart = 1, false
	c := n.start(t)
	waitPool(t, c, 1)
	if s := readySlots(c); s[0].prestarted() {
		t.Fatalf("slot of a pool without pre-start: %+v", s[0])
	}
	c.Close()

	n.cfg.PoolPrestart = true
	c = n.start(t)
	for _, s := range readySlots(c) {
		if !s.prestarted() {
			t.Fatalf("plain slot %s kept by a pool that pre-starts", s.rec.ID)
		}
	}
	waitPool(t, c, 1)
	if _, err := c.CreateSandbox(context.Background(), createReq("from-prestarted")); err != nil {
		t.Fatal(err)
	}
	rec, _ := c.store.Get("from-prestarted")
	if !isSlot(rec.Runtime()) {
		t.Fatalf("create did not resume a slot: runtime %q", rec.Runtime())
	}
}
