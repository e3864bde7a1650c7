package cubelet

import (
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/nodestore"
)

// The adaptive target with a fake clock: it grows to the largest recent
// burst, follows a sustained rate, stays within the budget, and returns to
// the floor once the window has passed without creates.
func TestDemandTarget(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	d := newDemand()
	if got := d.target("base", t0, 4, 100); got != 4 {
		t.Fatalf("no demand: target %d, want the floor 4", got)
	}
	for range 50 {
		d.record("base", t0)
	}
	if got := d.target("base", t0.Add(time.Second), 4, 100); got != 50 {
		t.Fatalf("after a burst of 50: target %d, want 50", got)
	}
	if got := d.target("other", t0, 4, 100); got != 4 {
		t.Fatalf("demand is per template: other's target %d, want 4", got)
	}
	if got := d.target("base", t0, 4, 20); got != 20 {
		t.Fatalf("budget of 20 slots: target %d", got)
	}
	if got := d.target("base", t0, 4, 2); got != 2 {
		t.Fatalf("budget below the floor wins: target %d", got)
	}
	// Still grown just before the window ends (the next burst of the
	// same run finds 50 slots), back to the floor after it.
	if got := d.target("base", t0.Add(demandWindow-demandBucket), 4, 100); got != 50 {
		t.Fatalf("within the window: target %d, want 50", got)
	}
	if got := d.target("base", t0.Add(demandWindow+demandBucket), 4, 100); got != 4 {
		t.Fatalf("idle for the window: target %d, want the floor 4", got)
	}
	// A sustained 2 creates/s for the whole window, never more than 10 in
	// a bucket: the rate term (2/s x 10 s lead) sets the target.
	d2 := newDemand()
	now := t0
	for range int(demandWindow.Seconds()) * 2 {
		d2.record("base", now)
		now = now.Add(500 * time.Millisecond)
	}
	if got := d2.target("base", now, 4, 100); got != 20 {
		t.Fatalf("sustained 2/s: target %d, want 20", got)
	}
	// A burst straddling a bucket boundary counts whole.
	d3 := newDemand()
	edge := time.Unix(0, (bucketOf(t0)+1)*int64(demandBucket))
	for i := range 30 {
		d3.record("base", edge.Add(time.Duration(i-15)*100*time.Millisecond))
	}
	if got := d3.target("base", edge, 4, 100); got != 30 {
		t.Fatalf("burst over a bucket boundary: target %d, want 30", got)
	}
}

// Buckets are reused around the ring: counts of a bucket a window ago do
// not add to the bucket that takes its place.
func TestDemandRingReuse(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	d := newDemand()
	for range 30 {
		d.record("base", t0)
	}
	later := t0.Add(demandWindow) // same ring slot, a window later
	d.record("base", later)
	if got := d.target("base", later, 0, 100); got != 1 {
		t.Fatalf("target %d, want 1 (the old burst left the window)", got)
	}
}

// The adaptive main target: sized by the pool template's demand within the
// budget (less the fixed --pool-templates slots), trimmed one slot at a
// time, oldest first, when it holds more; a fixed size is never trimmed.
func TestAdaptiveMainTarget(t *testing.T) {
	slot := func(id string) poolSlot {
		return poolSlot{rec: nodestore.Sandbox{ID: id, Template: DefaultPoolTemplate}, stage: stepLaunch}
	}
	const floor = 4
	c := &Cubelet{cfg: Config{PoolSize: PoolAdaptive, PoolMemoryMB: 20 * poolSlotCostMB, PoolFloor: floor, PoolPrestart: true,
		PoolTemplates: []PoolTarget{{Template: "interp", Size: 2}}}}
	c.pool.demand = newDemand()
	now := time.Now()
	if got := c.mainSize(now); got != floor {
		t.Fatalf("idle: main size %d, want the floor %d", got, floor)
	}
	for range 12 {
		c.pool.demand.record(DefaultPoolTemplate, now)
	}
	if got := c.mainSize(now); got != 12 {
		t.Fatalf("after a burst of 12: main size %d", got)
	}
	for range 30 {
		c.pool.demand.record(DefaultPoolTemplate, now)
	}
	if got := c.mainSize(now); got != 18 {
		t.Fatalf("burst of 42 with a budget of 20 slots, 2 fixed: main size %d, want 18", got)
	}
	if got := c.poolCapacity(); got != 20 {
		t.Fatalf("pool capacity %d, want the budget's 20", got)
	}
	// Demand gone: 6 ready main slots and one of the fixed target's;
	// trimmed to the floor, oldest first, the fixed slot kept.
	c.pool.demand = newDemand()
	fixed := poolSlot{rec: nodestore.Sandbox{ID: "pool-i", Template: "interp"}, stage: stepLaunch}
	c.pool.ready = []poolSlot{slot("pool-0"), fixed, slot("pool-1"), slot("pool-2"), slot("pool-3"), slot("pool-4"), slot("pool-5")}
	for c.trimLocked(now) {
	}
	if len(c.pool.ready) != floor+1 || len(c.pool.stale) != 2 ||
		c.pool.stale[0].rec.ID != "pool-0" || c.pool.stale[1].rec.ID != "pool-1" {
		t.Fatalf("after trimming: ready %v, stale %v", ids(c.pool.ready), ids(c.pool.stale))
	}
	fixedSize := &Cubelet{cfg: Config{PoolSize: 1}}
	fixedSize.pool.ready = []poolSlot{slot("a"), slot("b")}
	if fixedSize.trimLocked(now) {
		t.Fatal("a fixed --pool-size trimmed a slot")
	}
}

func ids(slots []poolSlot) []string {
	var out []string
	for _, s := range slots {
		out = append(out, s.rec.ID)
	}
	return out
}

// A PoolTemplates entry of size PoolAdaptive follows its own template's
// demand (floor 1) within what the budget leaves; the main target stays
// fixed; trimming takes only the adaptive entry's extra slots.
func TestAdaptivePoolTemplate(t *testing.T) {
	c := &Cubelet{cfg: Config{PoolSize: 2, PoolMemoryMB: 10 * poolSlotCostMB, PoolPrestart: true,
		PoolTemplates: []PoolTarget{{Template: "fixed", Size: 3}, {Template: "interp", Size: PoolAdaptive}}}}
	c.pool.demand = newDemand()
	now := time.Now()
	if sz := c.sizesAt(now); sz.main != 2 || sz.extras["fixed"] != 3 || sz.extras["interp"] != extraFloor {
		t.Fatalf("idle sizes %+v", sz)
	}
	for range 20 {
		c.pool.demand.record("interp", now)
	}
	if sz := c.sizesAt(now); sz.main != 2 || sz.extras["interp"] != 7 {
		t.Fatalf("burst of 20 with 10 budget slots, 3 fixed: sizes %+v, want interp 7", sz)
	}
	if got := c.poolCapacity(); got != 12 {
		t.Fatalf("capacity %d, want the fixed main 2 + budget 10", got)
	}
	slot := func(id, tmpl string) poolSlot {
		return poolSlot{rec: nodestore.Sandbox{ID: id, Template: tmpl}, stage: stepLaunch}
	}
	c.pool.demand = newDemand()
	c.pool.ready = []poolSlot{slot("m1", DefaultPoolTemplate), slot("m2", DefaultPoolTemplate), slot("m3", DefaultPoolTemplate),
		slot("i1", "interp"), slot("f1", "fixed"), slot("i2", "interp"), slot("i3", "interp")}
	for c.trimLocked(now) {
	}
	if got := ids(c.pool.stale); len(got) != 2 || got[0] != "i1" || got[1] != "i2" {
		t.Fatalf("trimmed %v, want the interp target's two oldest extra slots [i1 i2]", got)
	}
}

// The default idle floor covers a burst of DefaultPoolFloor creates on a
// host whose default budget pays for it, and the budget bounds it on a
// smaller one.
func TestDefaultPoolFloorWithinBudget(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		hostMB int64
		want   int
	}{
		{24 << 10, DefaultPoolFloor}, // this project's CI machines: budget 1536 MiB, 96 slots
		{16 << 10, DefaultPoolFloor},
		{8 << 10, 32},
		{2 << 10, 16}, // the budget's minimum, 256 MiB
	} {
		c := &Cubelet{cfg: Config{PoolSize: PoolAdaptive, PoolMemoryMB: DefaultPoolMemoryMB(tc.hostMB), PoolFloor: DefaultPoolFloor}}
		c.pool.demand = newDemand()
		if got := c.mainSize(now); got != tc.want {
			t.Errorf("host %d MiB: idle main size %d, want %d", tc.hostMB, got, tc.want)
		}
	}
}

// The budget pays for slots at what their target measured: cheap slots
// let the pool hold more of them, an expensive template fewer; unmeasured
// targets count at poolSlotCostMB.
func TestBudgetCountsMeasuredSlotCosts(t *testing.T) {
	c := &Cubelet{cfg: Config{PoolSize: PoolAdaptive, PoolMemoryMB: 20 * poolSlotCostMB, PoolFloor: 4, PoolPrestart: true,
		PoolTemplates: []PoolTarget{{Template: "interp", Size: PoolAdaptive}}}}
	c.pool.demand = newDemand()
	now := time.Now()
	for range 500 {
		c.pool.demand.record(DefaultPoolTemplate, now)
		c.pool.demand.record("interp", now)
	}
	if sz := c.sizesAt(now); sz.main != 20 || sz.extras["interp"] != 0 {
		t.Fatalf("unmeasured: sizes %+v, want main 20 (the budget at %d MiB a slot), interp 0", sz, poolSlotCostMB)
	}
	// A main slot measured 2 MiB in its cgroup: 4 MiB with the overhead.
	c.pool.costs.note(mainTarget, 2<<20)
	if got := c.pool.costs.of(mainTarget); got != 2+slotOverheadMB {
		t.Fatalf("cost %d MiB, want %d", got, 2+slotOverheadMB)
	}
	if sz := c.sizesAt(now); sz.main != 80 {
		t.Fatalf("main at 4 MiB a slot: %+v, want 80 (320 MiB / 4)", sz)
	}
	if got := c.poolCapacity(); got != 80 {
		t.Fatalf("capacity %d, want 80", got)
	}
	// Smoothing: one slot measured at 42 MiB moves the cost a quarter of
	// the way.
	c.pool.costs.note(mainTarget, 42<<20)
	if got := c.pool.costs.of(mainTarget); got != (3*4+44+3)/4 {
		t.Fatalf("smoothed cost %d", got)
	}
	// An expensive template gets what the main target leaves.
	c.pool.costs.note(mainTarget, 2<<20) // (3*14 + 4 + 3) / 4 = 12
	c.pool.costs.note("interp", 98<<20)  // 100 MiB a slot
	c.cfg.PoolMemoryMB = 1000
	c.pool.demand = newDemand()
	for range 30 {
		c.pool.demand.record(DefaultPoolTemplate, now)
		c.pool.demand.record("interp", now)
	}
	main := c.pool.costs.of(mainTarget)
	want := int((1000 - 30*main) / 100)
	if sz := c.sizesAt(now); sz.main != 30 || sz.extras["interp"] != want {
		t.Fatalf("sizes %+v, want main 30 and interp %d (what %d MiB leaves at 100 MiB a slot)", sz, want, 1000-30*main)
	}
}
