package cubelet

import (
	"context"
	"time"

	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/nodestore"
)

// DefaultMaintainInterval is how often a running cubelet looks for
// sandboxes whose supervisor died.
const DefaultMaintainInterval = 15 * time.Second

// maintain runs sweepDead, finishDeletes and refreshRuntime every
// interval until ctx ends. Orphan sweeping stays a start-up (Reconcile)
// and operator (`cube node gc`) job: while the cubelet serves, every
// kernel object it makes has a record first, so nothing new can become an
// orphan without a crash.
func (c *Cubelet) maintain(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.sweepDead(ctx)
			c.finishDeletes(ctx)
			c.refreshRuntime()
		}
	}
}

// sweepDead tears down running sandboxes whose supervisor is gone (the
// sandbox died or was killed from outside) and reports each through
// OnDead, so the control plane forgets it instead of listing a dead
// sandbox. It returns the ids it removed.
func (c *Cubelet) sweepDead(ctx context.Context) []string {
	recs, _ := c.store.List()
	var dead []string
	for _, r := range recs {
		// Only a supervisor known to be gone condemns a sandbox (see
		// liveness.go): a probe that timed out or was cancelled (the
		// cubelet shutting down) proves nothing.
		if ctx.Err() != nil {
			return dead
		}
		if r.State != nodestore.StateRunning || keepRecord(r, c.livenessOf(ctx, r.Runtime())) {
			continue
		}
		unlock := c.lock(r.ID)
		cur, err := c.store.Get(r.ID)
		if err != nil || cur.State != nodestore.StateRunning || keepRecord(cur, c.livenessOf(ctx, cur.Runtime())) || ctx.Err() != nil {
			unlock() // changed meanwhile (killed, or a false alarm)
			continue
		}
		c.log.Warn("sandbox died: its supervisor is gone; removing it", "sandbox", r.ID)
		err = c.teardown(nodeproto.WithKillReason(ctx, reasonDied), cur)
		unlock()
		if err != nil {
			c.log.Warn("remove dead sandbox", "sandbox", r.ID, "err", err)
			continue
		}
		dead = append(dead, r.ID)
		if c.cfg.OnDead != nil {
			c.cfg.OnDead(r.ID)
		}
	}
	return dead
}

// finishDeletes retries the teardown of sandboxes left "deleting" by a
// kill or a failed create's cleanup that failed part-way. One still in
// progress holds the sandbox's lock; once finishDeletes has it, the record
// is gone or no longer deleting and there is nothing to do.
func (c *Cubelet) finishDeletes(ctx context.Context) {
	recs, _ := c.store.List()
	for _, r := range recs {
		if r.State != nodestore.StateDeleting || ctx.Err() != nil {
			continue
		}
		unlock := c.lock(r.ID)
		cur, err := c.store.Get(r.ID)
		if err == nil && cur.State == nodestore.StateDeleting {
			if err := c.teardown(ctx, cur); err != nil {
				c.log.Warn("finish deleting sandbox", "sandbox", r.ID, "err", err)
			}
		}
		unlock()
	}
}

// checkDeferred asks the supervisor of every running sandbox, once, right
// after New's reconcile adopted them without asking (reconcile with
// deferProbes): a probe is a unix-socket round trip per sandbox, the part
// of a restart that grew with their number, and nothing in serving needs
// its answer first. A record holds its sandbox's IP and host ports whatever
// the supervisor says (addrs.go), so no create can collide with a live
// sandbox; a dead one is torn down and reported (OnDead) here, under its
// own lock, as the periodic sweep does with sandboxes that die later.
//
// It returns at once when nothing was adopted unprobed; otherwise it runs
// in the background (run) and is waited for by Close.
func (c *Cubelet) checkDeferred(rep ReconcileReport) (run func(context.Context)) {
	if rep.Unprobed == 0 {
		return func(context.Context) {}
	}
	running := make(map[string]nodestore.Sandbox, len(rep.Adopted))
	for _, id := range rep.Adopted {
		if r, err := c.store.Get(id); err == nil && r.State == nodestore.StateRunning {
			running[id] = r
		}
	}
	return func(ctx context.Context) { c.checkAdopted(ctx, running) }
}

func (c *Cubelet) checkAdopted(ctx context.Context, running map[string]nodestore.Sandbox) {
	start := time.Now()
	// Probes 16 at a time and watches every supervisor that answers, so
	// sweepDead passes those without a call and re-probes only the rest.
	c.livenessOfRunning(ctx, running)
	dead := c.sweepDead(ctx)
	c.log.Info("sandboxes checked after start", "checked", len(running), "dead", len(dead), "duration", time.Since(start))
}
