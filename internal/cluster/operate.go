package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// DefaultDrainGrace is how long a drain waits for in-flight creates.
const DefaultDrainGrace = 60 * time.Second

// update changes a node's durable record with fn and persists it.
func (r *Registry) update(ctx context.Context, id string, fn func(rec *NodeRecord) error) error {
	r.mu.Lock()
	_, ok := r.nodes[id]
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("node %s: %w", id, errdefs.ErrNotFound)
	}
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
	err := r.update(ctx, id, func(rec *NodeRecord) error {
		rec.Isolated = true
		if rec.Drain != nil && rec.Drain.Policy == d.Policy {
			return nil
		}
		d.StartedAt = time.Now().UTC()
		rec.Drain = &d
		return nil
	})
	if err == nil {
		r.mu.Lock()
		if n, ok := r.nodes[id]; ok && n.rec.Drain != nil {
			n.phase = r.drainPhase(*n.rec.Drain)
		}
		r.mu.Unlock()
	}
	return err
}

// Delete deregisters a node. Without force the node must be isolated and
// empty; with force its sandbox records are forgotten too.
func (r *Registry) Delete(ctx context.Context, id string, force bool) error {
	st, err := r.Node(id)
	if err != nil {
		return err
	}
	if !force && (st.State == StateReady || st.Sandboxes > 0 || st.Inflight > 0) {
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
		if !n.down && time.Since(n.lastBeat) > r.cfg.DownAfter {
			late = append(late, n)
		}
	}
	r.mu.Unlock()
	for _, n := range late {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
		_, err := n.client.Info(pctx)
		cancel()
		r.mu.Lock()
		if err == nil {
			n.lastBeat = time.Now() // alive but not heartbeating: keep it, say why
			n.reason = "heartbeats late; probe ok"
		} else if time.Since(n.lastBeat) > r.cfg.DownAfter {
			n.down = true
			n.reason = fmt.Sprintf("no heartbeat for %s and probe failed: %v", time.Since(n.lastBeat).Round(time.Second), err)
			r.log.Warn("node down", "node", n.rec.ID, "reason", n.reason)
		}
		down, reason, id := n.down, n.reason, n.rec.ID
		r.mu.Unlock()
		if _, err := r.persist(ctx, id, func(rec *NodeRecord, found bool) error {
			if !found {
				return fmt.Errorf("node %s: %w", id, errdefs.ErrNotFound)
			}
			rec.Down, rec.DownReason = down, reason
			return nil
		}); err != nil {
			r.log.Warn("record node health", "node", id, "err", err)
		}
	}
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
		if n, ok := r.nodes[j.id]; ok && n.phase != "done" {
			n.phase = phase // visible while the kills below run
		}
		r.mu.Unlock()
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
		r.recount(ctx)
		r.mu.Lock()
		if n, ok := r.nodes[j.id]; ok {
			n.phase = phase
			if n.count == 0 && phase != "grace" {
				n.phase = "done"
			}
		}
		r.mu.Unlock()
	}
}

// drainPhase is a pure function of the drain and the clock.
func (r *Registry) drainPhase(d Drain) string {
	elapsed := time.Since(d.StartedAt)
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
