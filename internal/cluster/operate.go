package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
)

// DefaultDrainGrace is how long a drain waits for in-flight creates.
const DefaultDrainGrace = 60 * time.Second

// update changes a node's durable record with fn and persists it. The
// store decides whether the node exists: it may have registered through
// another replica a moment ago.
func (r *Registry) update(ctx context.Context, id string, fn func(rec *NodeRecord) error) error {
	_, err := r.persist(ctx, id, func(rec *NodeRecord, found bool) error {
		if !found {
			return fmt.Errorf("node %s: %w", id, errdefs.ErrNotFound)
		}
		return fn(rec)
	})
	if err != nil {
		return fmt.Errorf("update node %s: %w", id, err)
	}
	return nil
}

// Isolate stops scheduling onto a node; its sandboxes keep running.
// Idempotent.
func (r *Registry) Isolate(ctx context.Context, id string) error {
	return r.update(ctx, id, func(rec *NodeRecord) error {
		rec.Isolated = true
		return nil
	})
}

// Uncordon makes a node schedulable again and cancels a drain.
func (r *Registry) Uncordon(ctx context.Context, id string) error {
	return r.update(ctx, id, func(rec *NodeRecord) error {
		rec.Isolated, rec.Drain = false, nil
		return nil
	})
}

// Drain isolates a node and starts draining it. Draining an already
// draining node keeps the original start time (idempotent), so a repeated
// or resumed drain does not restart the grace period.
func (r *Registry) Drain(ctx context.Context, id string, d Drain) error {
	if d.Policy != DrainWait && d.Policy != DrainKill {
		return fmt.Errorf("drain policy %q: want wait or kill: %w", d.Policy, errdefs.ErrInvalidArgument)
	}
	if d.Grace < 0 || d.Deadline < 0 {
		return fmt.Errorf("drain durations must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	var started Drain
	err := r.update(ctx, id, func(rec *NodeRecord) error {
		rec.Isolated = true
		if rec.Drain == nil || rec.Drain.Policy != d.Policy {
			d.StartedAt = r.cfg.Clock.Now().UTC()
			rec.Drain = &d
		}
		started = *rec.Drain
		return nil
	})
	if err != nil {
		return err
	}
	if err := r.recount(ctx); err != nil {
		r.log.Warn("drain: recount", "node", id, "err", err)
	}
	r.mu.Lock()
	count := 0
	if n, ok := r.nodes[id]; ok {
		count = n.count
	}
	r.mu.Unlock()
	r.setProgress(ctx, id, started, r.drainPhase(started), count)
	return nil
}

// setProgress stores a drain's progress when it changed, so every replica
// reports it (see statusLocked). A failed write is logged: the next tick
// of driveDrains writes again.
func (r *Registry) setProgress(ctx context.Context, id string, d Drain, phase string, remaining int) {
	r.mu.Lock()
	var cur *DrainProgress
	if n, ok := r.nodes[id]; ok {
		cur = n.rec.Progress
	}
	r.mu.Unlock()
	if cur != nil && cur.DrainStartedAt.Equal(d.StartedAt) && cur.Phase == phase && cur.Remaining == remaining {
		return
	}
	p := DrainProgress{DrainStartedAt: d.StartedAt, Phase: phase, Remaining: remaining, UpdatedAt: r.cfg.Clock.Now().UTC()}
	if err := r.store.SetDrainProgress(ctx, id, p); err != nil {
		r.log.Warn("record drain progress", "node", id, "phase", phase, "err", err)
		return
	}
	r.mu.Lock()
	if n, ok := r.nodes[id]; ok {
		n.rec.Progress = &p
	}
	r.mu.Unlock()
}

// Delete deregisters a node. Without force the node must be isolated and
// empty; with force its sandbox records are forgotten too.
func (r *Registry) Delete(ctx context.Context, id string, force bool) error {
	st, err := r.Node(id)
	if err != nil {
		return err
	}
	if !force && (st.State == StateReady || st.State == StatePending || st.Sandboxes > 0 || st.Inflight > 0) {
		return fmt.Errorf("node %s is %s with %d sandboxes: isolate and drain it first, or delete with --force: %w",
			id, st.State, st.Sandboxes, errdefs.ErrFailedPrecondition)
	}
	if force {
		if err := r.forgetNodeSandboxes(ctx, id); err != nil {
			return err
		}
	}
	if err := r.store.DeleteNode(ctx, id); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.nodes, id)
	r.mu.Unlock()
	r.log.Info("node deleted", "node", id, "force", force)
	return nil
}

func (r *Registry) forgetNodeSandboxes(ctx context.Context, id string) error {
	all, err := r.index.AllSandboxes(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	life := r.life
	r.mu.Unlock()
	for _, sb := range all {
		if sb.NodeID == id && life != nil {
			if err := life.Forget(ctx, sb.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// Run drives health checks and drains until ctx ends. On several server
// replicas only the leader runs it.
func (r *Registry) Run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.checkHealth(ctx)
			r.driveDrains(ctx)
		}
	}
}

// checkHealth probes nodes that missed heartbeats and marks them Down when
// the probe fails too.
func (r *Registry) checkHealth(ctx context.Context) {
	if err := r.Sync(ctx); err != nil {
		r.log.Warn("sync nodes before health check", "err", err)
		return
	}
	r.mu.Lock()
	var late []*node
	for _, n := range r.nodes {
		if !n.down && r.cfg.Clock.Since(n.lastBeat) > r.cfg.DownAfter {
			late = append(late, n)
		}
	}
	r.mu.Unlock()
	for _, n := range late {
		r.mu.Lock()
		cl := n.client
		r.mu.Unlock()
		err := r.probe(ctx, cl)
		if err != nil {
			// The cubelet may have re-registered (new token or address)
			// through another replica since the Sync above: re-read its
			// record and probe once more with the new client rather than
			// call a live node Down for a stale token.
			if fresh, changed := r.reloadClient(ctx, n, cl); changed {
				err = r.probe(ctx, fresh)
			}
		}
		r.mu.Lock()
		if err == nil {
			n.lastBeat = r.cfg.Clock.Now() // alive but not heartbeating: keep it, say why
			n.reason, n.confirmed = "heartbeats late; probe ok", true
		} else if r.cfg.Clock.Since(n.lastBeat) > r.cfg.DownAfter {
			n.down = true
			n.reason = fmt.Sprintf("no heartbeat for %s and probe failed: %v", r.cfg.Clock.Since(n.lastBeat).Round(time.Second), err)
			r.log.Warn("node down", "node", n.rec.ID, "reason", n.reason)
		}
		down, reason, id, judged := n.down, n.reason, n.rec.ID, n.lastBeat
		r.mu.Unlock()
		stored, err := r.persist(ctx, id, func(rec *NodeRecord, found bool) error {
			if !found {
				return fmt.Errorf("node %s: %w", id, errdefs.ErrNotFound)
			}
			if down && rec.LastHeartbeat.After(judged) {
				// A heartbeat or registration reached another replica
				// after the judgement: the node is alive.
				return nil
			}
			rec.Down, rec.DownReason = down, reason
			return nil
		})
		if err != nil {
			r.log.Warn("record node health", "node", id, "err", err)
			continue
		}
		if down && !stored.Down {
			r.mu.Lock()
			n.down, n.reason = false, ""
			if stored.LastHeartbeat.After(n.lastBeat) {
				n.lastBeat = stored.LastHeartbeat
			}
			r.mu.Unlock()
		}
	}
}

func (r *Registry) probe(ctx context.Context, cl *nodeapi.Client) error {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	defer cancel()
	_, err := cl.Info(pctx)
	return err
}

// driveDrains advances every drain: after the grace period, kill the
// node's sandboxes (policy kill) or wait for their TTLs until the deadline
// and then kill what is left (policy wait).
func (r *Registry) driveDrains(ctx context.Context) {
	type job struct {
		id    string
		drain Drain
	}
	r.mu.Lock()
	var jobs []job
	for _, n := range r.nodes {
		if n.rec.Drain != nil {
			jobs = append(jobs, job{n.rec.ID, *n.rec.Drain})
		}
	}
	life := r.life
	r.mu.Unlock()
	for _, j := range jobs {
		phase := r.drainPhase(j.drain)
		r.mu.Lock()
		n, ok := r.nodes[j.id]
		var prev *DrainProgress
		count := 0
		if ok {
			prev, count = n.rec.Progress, n.count
		}
		r.mu.Unlock()
		if !ok {
			continue
		}
		if prev == nil || !prev.DrainStartedAt.Equal(j.drain.StartedAt) || prev.Phase != "done" {
			r.setProgress(ctx, j.id, j.drain, phase, count) // visible while the kills below run
		}
		if phase == "killing" && life != nil {
			all, err := r.index.AllSandboxes(ctx)
			if err != nil {
				continue
			}
			for _, sb := range all {
				if sb.NodeID == j.id {
					if err := life.Kill(ctx, sb.ID); err != nil {
						r.log.Warn("drain: kill sandbox", "node", j.id, "sandbox", sb.ID, "err", err)
					}
				}
			}
		}
		if err := r.recount(ctx); err != nil {
			r.log.Warn("drain: recount", "node", j.id, "err", err)
			continue
		}
		r.mu.Lock()
		count = n.count
		r.mu.Unlock()
		if count == 0 && phase != "grace" {
			phase = "done"
		}
		r.setProgress(ctx, j.id, j.drain, phase, count)
	}
}

// drainPhase is a pure function of the drain and the clock.
func (r *Registry) drainPhase(d Drain) string {
	elapsed := r.cfg.Clock.Since(d.StartedAt)
	switch {
	case elapsed < d.Grace:
		return "grace"
	case d.Policy == DrainKill:
		return "killing"
	case d.Deadline > 0 && elapsed >= d.Grace+d.Deadline:
		return "killing"
	default:
		return "waiting"
	}
}
