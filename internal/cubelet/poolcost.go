package cubelet

import (
	"sync"

	"github.com/cube-dev/cube/internal/cgroup"
)

// slotCosts is what one ready slot of each pool target costs in memory
// (MiB), measured on the slots the pool makes: the adaptive pool's budget
// (Config.PoolMemoryMB) pays for slots at these costs, not at a fixed
// guess. Before a target's first slot is measured it is counted at
// poolSlotCostMB.
//
// A pre-started base slot measured 3.3 MiB with 2000 resident (shim and
// envd PSS plus kernel objects, docs/benchmarks.md) against the 16 MiB it
// was counted at, so the default budget (a sixteenth of the host's memory)
// kept 94 slots on a 24 GiB host where it pays for ~300; a code-interpreter
// slot, whose kernel is up, costs far more than 16.
type slotCosts struct {
	mu sync.Mutex
	mb map[string]int64 // target -> MiB per slot
}

// slotOverheadMB is what a slot costs outside its cgroup: its shim (PSS
// ~0.75 MiB, in the shims' cgroup) and kernel objects charged to no
// sandbox (netns, veth, nftables elements: ~0.7 MiB per sandbox measured
// at 2000), rounded up.
const slotOverheadMB = 2

// of returns the cost of one slot of target k.
func (s *slotCosts) of(k string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if mb, ok := s.mb[k]; ok {
		return mb
	}
	return poolSlotCostMB
}

// least returns the smallest cost of any target (what the most slots the
// budget can pay for are counted at).
func (s *slotCosts) least() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	least := int64(poolSlotCostMB)
	for _, mb := range s.mb {
		least = min(least, mb)
	}
	return least
}

// note records a measured slot of target k (usedBytes: its cgroup's memory
// less page cache). Measurements are smoothed (3/4 old, 1/4 new, rounded
// up) so one slot measured early or late does not swing the pool.
func (s *slotCosts) note(k string, usedBytes int64) {
	mb := (max(usedBytes, 0)+1<<20-1)>>20 + slotOverheadMB
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mb == nil {
		s.mb = map[string]int64{}
	}
	if old, ok := s.mb[k]; ok {
		mb = (3*old + mb + 3) / 4
	}
	s.mb[k] = mb
}

// measureSlot notes the memory of a slot just made against its target.
// A slot whose cgroup cannot be read is not counted.
func (c *Cubelet) measureSlot(s poolSlot) {
	cg, err := cgroup.Open(c.cfg.CgroupParent, s.rec.Runtime())
	if err != nil {
		return
	}
	st, err := cg.Stats()
	if err != nil {
		return
	}
	c.pool.costs.note(c.slotTarget(s), st.MemUsage-st.MemCache)
}
