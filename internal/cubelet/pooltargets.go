package cubelet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// The warm pool keeps slots for targets: the main target (Config.PoolSize
// slots, pre-started sandboxes of Config.PoolTemplate, or plain slots) and
// one per Config.PoolTemplates entry (pre-started sandboxes of that
// template only). A pre-started slot runs everything its template starts
// at boot, so a slot of code-interpreter-v1 has its Python kernel up
// (cube-interp starts it at once) and a create from it answers its first
// runCode without waiting for the kernel.
//
// A target's template that is not on the node is not fetched or built for
// the pool: its slots are made once the template arrives (the first
// create of it fetches or builds it; the all-in-one builds
// code-interpreter-v1 in the background), looked for again every
// poolTemplateRetry.

// PoolTarget asks the warm pool to keep Size pre-started slots of Template
// (PoolAdaptive: as many as its demand asks, see pooldemand.go).
type PoolTarget struct {
	Template string
	Size     int
}

// mainTarget keys the main target in the pool's per-target counts.
const mainTarget = ""

// poolTemplateRetry is how often a target whose template the node lacks
// is looked at again.
const poolTemplateRetry = 5 * time.Second

// errTemplateNotHere marks a target whose template is not on the node.
var errTemplateNotHere = errors.New("template not on this node")

// validatePoolTargets refuses targets the pool cannot keep apart.
func validatePoolTargets(cfg Config) error {
	seen := map[string]bool{}
	for _, t := range cfg.PoolTemplates {
		switch {
		case t.Template == "":
			return fmt.Errorf("warm pool target without a template name: %w", errdefs.ErrInvalidArgument)
		case t.Size < 0 && t.Size != PoolAdaptive:
			return fmt.Errorf("warm pool target %s: negative size %d: %w", t.Template, t.Size, errdefs.ErrInvalidArgument)
		case seen[t.Template]:
			return fmt.Errorf("warm pool target %s named twice: %w", t.Template, errdefs.ErrInvalidArgument)
		case t.Template == poolTemplateOf(cfg):
			return fmt.Errorf("warm pool target %s is the main pool's template: size it with the pool size: %w", t.Template, errdefs.ErrInvalidArgument)
		}
		seen[t.Template] = true
	}
	return nil
}

func poolTemplateOf(cfg Config) string {
	if cfg.PoolTemplate == "" {
		return DefaultPoolTemplate
	}
	return cfg.PoolTemplate
}

// poolCapacity is the number of slots all targets keep together (at most,
// when some are adaptive: those share the budget).
func (c *Cubelet) poolCapacity() int {
	if c.anyAdaptive() {
		return max(0, c.cfg.PoolSize) + c.poolBudgetSlots()
	}
	n := c.cfg.PoolSize
	for _, t := range c.cfg.PoolTemplates {
		n += t.Size
	}
	return n
}

// hasExtra reports whether template name has a PoolTemplates entry that
// asks for slots (a fixed size above 0, or adaptive).
func (c *Cubelet) hasExtra(name string) bool {
	for _, t := range c.cfg.PoolTemplates {
		if t.Template == name {
			return t.Size != 0
		}
	}
	return false
}

// slotTarget is the target a slot counts for: the template's own target
// for a pre-started slot of a PoolTemplates entry, else the main one.
func (c *Cubelet) slotTarget(s poolSlot) string {
	if s.prestarted() && c.hasExtra(s.rec.Template) {
		return s.rec.Template
	}
	return mainTarget
}

// wantedSlot reports whether the pool keeps a slot like s at all: a slot
// of a PoolTemplates entry while that entry asks for slots; slots of the
// main template while the main target does; plain slots while the main
// target makes them (plainWanted: no pre-started slots, or their template
// is missing). A plain slot left from a run without PoolPrestart would
// otherwise be taken before the pre-started ones and cost its create the
// launch.
func (c *Cubelet) wantedSlot(s poolSlot, plainWanted bool) bool {
	if c.slotTarget(s) != mainTarget {
		return true
	}
	if c.cfg.PoolSize == 0 {
		return false
	}
	if !s.prestarted() {
		return plainWanted
	}
	return s.rec.Template == c.poolTemplate()
}

// plainSlotsWanted: the main target makes plain slots (see wantedSlot).
func (c *Cubelet) plainSlotsWanted(ctx context.Context) bool {
	if !c.cfg.PoolPrestart || c.templates == nil { // offline tools (offline.go) have no registry
		return true
	}
	_, err := c.templates.Get(ctx, c.poolTemplate())
	return err != nil
}

// nextTargetLocked picks the target to make a slot for: the one furthest
// below its size (the main target on a tie), skipping targets whose
// template was missing less than poolTemplateRetry ago. need is how many
// slots are missing over all targets it may make now; wake, when not
// zero, is when a skipped target should be looked at again. The caller
// holds c.pool.mu.
func (c *Cubelet) nextTargetLocked(now time.Time) (key string, need int, wake time.Time) {
	have := map[string]int{}
	for _, s := range c.pool.ready {
		have[c.slotTarget(s)]++
	}
	best := -1
	consider := func(k string, size int) {
		if until, ok := c.pool.missing[k]; ok && now.Before(until) {
			if wake.IsZero() || until.Before(wake) {
				wake = until
			}
			return
		}
		short := size - have[k] - c.pool.building[k]
		if short <= 0 {
			return
		}
		need += short
		if short > best {
			key, best = k, short
		}
	}
	sz := c.sizesAt(now)
	consider(mainTarget, sz.main)
	for _, t := range c.cfg.PoolTemplates {
		consider(t.Template, sz.extras[t.Template])
	}
	return key, need, wake
}

// templateArrived tells the pool a template is now on the node: a target
// waiting for it is looked at at once.
func (c *Cubelet) templateArrived(name string) {
	c.pool.mu.Lock()
	_, waiting := c.pool.missing[name]
	delete(c.pool.missing, name)
	c.pool.mu.Unlock()
	if waiting {
		c.kickPool()
	}
}
