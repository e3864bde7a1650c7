package cubelet

import (
	"math"
	"sync"
	"syscall"
	"time"
)

// The adaptive warm pool (Config.PoolSize = PoolAdaptive): the main
// target's size follows the demand for its template instead of a fixed
// number. Agent workloads come in bursts (an evaluation run, a batch of
// rollouts) that repeat: after a burst of N creates the pool keeps about N
// slots ready for the next one, for as long as bursts keep coming; when
// creates stop it shrinks back to a small floor. A memory budget bounds it.
//
// Demand is counted in buckets of demandBucket over demandWindow:
//
//	target = clamp(max(floor, biggest burst, rate x demandLead), 0, cap)
//
// The floor (Config.PoolFloor) is large enough by default that a first
// burst of agents after a quiet hour is served warm too: an idle slot is a
// few MiB of memory and no CPU, a cold create ~30 ms of CPU.
//
// where the biggest burst is the most creates in two consecutive buckets
// (5-10 s) seen in the window, rate the
// window's average creates per second (sustained load: enough slots to
// cover demandLead of it while the refill catches up) and cap the budget's
// slot count. A burst bigger than the current target is served cold past
// the ready slots; the pool has grown by the next one.

// PoolAdaptive as Config.PoolSize sizes the main target by demand.
const PoolAdaptive = -1

const (
	// demandBucket is the span creates count as one burst in.
	demandBucket = 5 * time.Second
	// demandWindow is how long a burst keeps the pool grown; past it with
	// no creates the pool is back to its floor.
	demandWindow = 10 * time.Minute
	// demandLead is how many seconds of the recent create rate the pool
	// keeps ready.
	demandLead = 10.0
	// DefaultPoolFloor is what the adaptive pool keeps with no demand,
	// within the budget: a burst of up to this many creates after a quiet
	// hour (a batch of agents, an evaluation run) is still served warm. At
	// the default budget (a sixteenth of the host's memory, 16 MiB a slot
	// until measured) a host of 16 GiB or more keeps all of it, an 8 GiB
	// one 32 until its slots are measured (then more).
	DefaultPoolFloor = 64
	// poolSlotCostMB is the memory one slot is counted at against the
	// budget until a slot of its target has been measured (poolcost.go).
	poolSlotCostMB = 16
)

// DefaultPoolMemoryMB is the adaptive pool's default budget for hostMB of
// memory: a sixteenth of it, at least 256 MiB (16 slots).
func DefaultPoolMemoryMB(hostMB int64) int64 { return max(256, hostMB/16) }

// demand counts creates per template in time buckets. It is safe for
// concurrent use.
type demand struct {
	mu      sync.Mutex
	buckets map[string]*ring // template -> recent counts
}

// ring holds counts for the buckets of the last demandWindow; slot i
// counts bucket number at[i] (unix time / demandBucket).
type ring struct {
	n  [int(demandWindow / demandBucket)]int
	at [int(demandWindow / demandBucket)]int64
}

func newDemand() *demand { return &demand{buckets: map[string]*ring{}} }

func bucketOf(t time.Time) int64 { return t.UnixNano() / int64(demandBucket) }

// record counts one create of template at now.
func (d *demand) record(template string, now time.Time) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.buckets[template]
	if r == nil {
		r = &ring{}
		d.buckets[template] = r
	}
	b := bucketOf(now)
	i := int(b % int64(len(r.n)))
	if r.at[i] != b {
		r.at[i], r.n[i] = b, 0
	}
	r.n[i]++
}

// target is the number of slots of template to keep at now, between floor
// and limit (limit < floor: limit wins, the budget is a hard bound).
func (d *demand) target(template string, now time.Time, floor, limit int) int {
	want := floor
	if d == nil {
		return max(0, min(want, limit))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.buckets[template]; r != nil {
		cur := bucketOf(now)
		oldest := cur - int64(len(r.n)) + 1
		// A burst is the creates of two consecutive buckets: one that
		// straddles a bucket boundary counts whole.
		count := func(b int64) int {
			i := int(b % int64(len(r.n)))
			if b < oldest || b > cur || r.at[i] != b {
				return 0
			}
			return r.n[i]
		}
		peak, total := 0, 0
		for b := oldest; b <= cur; b++ {
			n := count(b)
			total += n
			peak = max(peak, n+count(b-1))
		}
		rate := float64(total) / demandWindow.Seconds()
		want = max(want, peak, int(math.Ceil(rate*demandLead)))
		if total == 0 {
			delete(d.buckets, template) // idle for the whole window
		}
	}
	return max(0, min(want, limit))
}

// adaptive reports whether the main target is sized by demand.
func (c *Cubelet) adaptive() bool { return c.cfg.PoolSize < 0 }

// anyAdaptive reports whether some target is sized by demand (the main one,
// or a PoolTemplates entry of size PoolAdaptive).
func (c *Cubelet) anyAdaptive() bool { return anyAdaptive(c.cfg) }

func anyAdaptive(cfg Config) bool {
	if cfg.PoolSize < 0 {
		return true
	}
	for _, t := range cfg.PoolTemplates {
		if t.Size < 0 {
			return true
		}
	}
	return false
}

// poolBudgetSlots is how many slots the adaptive pool's memory budget
// (Config.PoolMemoryMB) pays for at most: at the cheapest target's cost.
func (c *Cubelet) poolBudgetSlots() int {
	return int(c.cfg.PoolMemoryMB / c.pool.costs.least())
}

// extraFloor is what an adaptive PoolTemplates target keeps with no
// demand: the template's first create is warm.
const extraFloor = 1

// poolSizes are the targets' sizes at one instant.
type poolSizes struct {
	main   int
	extras map[string]int // PoolTemplates entry -> size
}

// sizesAt returns every target's size at now. Fixed sizes are what they
// say. Adaptive ones follow their template's demand within the budget,
// which pays for the fixed PoolTemplates slots first, then the main
// target, then the adaptive entries in their order.
func (c *Cubelet) sizesAt(now time.Time) poolSizes {
	sz := poolSizes{main: c.cfg.PoolSize, extras: make(map[string]int, len(c.cfg.PoolTemplates))}
	left := c.cfg.PoolMemoryMB // MiB, each slot at its target's measured cost
	for _, t := range c.cfg.PoolTemplates {
		if t.Size >= 0 {
			sz.extras[t.Template] = t.Size
			left -= int64(t.Size) * c.pool.costs.of(t.Template)
		}
	}
	slots := func(k string) int { return int(max(left, 0) / c.pool.costs.of(k)) }
	if c.adaptive() {
		sz.main = c.pool.demand.target(c.poolTemplate(), now, c.cfg.PoolFloor, slots(mainTarget))
		left -= int64(sz.main) * c.pool.costs.of(mainTarget)
	}
	for _, t := range c.cfg.PoolTemplates {
		if t.Size < 0 {
			sz.extras[t.Template] = c.pool.demand.target(t.Template, now, extraFloor, slots(t.Template))
			left -= int64(sz.extras[t.Template]) * c.pool.costs.of(t.Template)
		}
	}
	return sz
}

// mainSize is the main target's size at now.
func (c *Cubelet) mainSize(now time.Time) int { return c.sizesAt(now).main }

// trimLocked sets aside, for the refill loop to drop, one ready slot of an
// adaptive target that holds more than its size (the pool shrinking after
// demand went away); true when it did. The target's oldest slot goes:
// takeSlot takes the newest. The caller holds c.pool.mu.
func (c *Cubelet) trimLocked(now time.Time) bool {
	if !c.anyAdaptive() {
		return false
	}
	sz := c.sizesAt(now)
	have, oldest := map[string]int{}, map[string]int{}
	for i, s := range c.pool.ready {
		k := c.slotTarget(s)
		if have[k] == 0 {
			oldest[k] = i
		}
		have[k]++
	}
	trim := func(k string, size int) bool {
		if have[k] <= size {
			return false
		}
		i := oldest[k]
		s := c.pool.ready[i]
		c.pool.ready = append(c.pool.ready[:i], c.pool.ready[i+1:]...)
		c.pool.stale = append(c.pool.stale, s)
		return true
	}
	if c.adaptive() && trim(mainTarget, sz.main) {
		return true
	}
	for _, t := range c.cfg.PoolTemplates {
		if t.Size < 0 && trim(t.Template, sz.extras[t.Template]) {
			return true
		}
	}
	return false
}

// hostMemoryMB is the host's total memory (0 when unknown).
func hostMemoryMB() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit) >> 20
}
