package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Heartbeat records that a node is alive and reconciles its sandboxes with
// the server's records: sandboxes the server no longer knows are returned
// for the node to kill; recorded sandboxes the node no longer runs are lost
// and forgotten. reregister tells an unknown node to register again.
// health, when not nil, replaces the node's reported self-checks.
func (r *Registry) Heartbeat(ctx context.Context, id string, running []string, templates []TemplateRef, health *NodeHealth) (kill []string, reregister bool, err error) {
	r.mu.Lock()
	n, ok := r.nodes[id]
	if !ok {
		r.mu.Unlock()
		return nil, true, nil
	}
	if n.down {
		r.log.Info("node is back", "node", id)
	}
	n.lastBeat, n.down, n.reason, n.confirmed = r.cfg.Clock.Now(), false, "", true
	beat := n.lastBeat.UTC()
	life := r.life
	r.mu.Unlock()
	// Persist so the replica running health checks sees it; only health
	// fields change, so an operator action racing with it is never undone.
	if _, err := r.persist(ctx, id, func(stored *NodeRecord, found bool) error {
		if !found {
			return fmt.Errorf("node %s: %w", id, errdefs.ErrNotFound)
		}
		stored.LastHeartbeat, stored.Down, stored.DownReason = beat, false, ""
		if templates != nil {
			stored.Templates = templates
		}
		if health != nil {
			stored.Health = health
		}
		return nil
	}); err != nil {
		return nil, false, fmt.Errorf("record heartbeat of %s: %w", id, err)
	}

	all, err := r.index.AllSandboxes(ctx)
	if err != nil {
		return nil, false, err
	}
	onNode := map[string]bool{}
	for _, sid := range running {
		onNode[sid] = true
	}
	known := map[string]bool{}
	remaining := all[:0:0]
	for _, sb := range all {
		if sb.NodeID != id {
			remaining = append(remaining, sb)
			continue
		}
		known[sb.ID] = true
		// Recent on this replica, or recorded moments ago by any replica:
		// the node's list may predate the create (another replica made it
		// while this heartbeat was in flight).
		recent := r.isRecent(sb.ID) || r.cfg.Clock.Since(sb.StartedAt) < recordedGrace
		if !onNode[sb.ID] && !recent && life != nil {
			// A kill that ran since this table was read already removed
			// it (not found): nothing was lost.
			err := life.Forget(ctx, sb.ID)
			if err == nil {
				r.log.Warn("sandbox lost: its node no longer runs it", "node", id, "sandbox", sb.ID)
				continue
			}
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			r.log.Warn("forget lost sandbox", "sandbox", sb.ID, "err", err)
		}
		remaining = append(remaining, sb)
	}
	kill = r.strays(id, running, known)
	// One read of the sandbox table serves both the reconcile above and
	// the capacity recount (less what was just forgotten).
	r.recountFrom(remaining)
	return kill, false, nil
}

// recordedGrace is how long after its record's start time a sandbox
// missing from a node's heartbeat is not yet taken for lost: longer than a
// heartbeat takes from the node's listing to this check, short enough that
// a sandbox dying right after its create is forgotten soon.
const recordedGrace = 5 * time.Second

// strayGrace is how long a sandbox a node runs must stay unknown to this
// replica before the node is told to kill it. Another replica may have
// made it and not yet written its record (the mirror of recordedGrace):
// killing on first sight lost such sandboxes. A real stray (its create's
// replica died before recording it) goes a few heartbeats later.
const strayGrace = 5 * time.Second

// strays returns the sandboxes running on node that have been unknown
// (no record, no create in flight here) for strayGrace, and forgets the
// first sightings of those no longer unknown.
func (r *Registry) strays(node string, running []string, known map[string]bool) []string {
	now := r.cfg.Clock.Now()
	seen := map[string]time.Time{}
	var kill []string
	for _, sid := range running {
		if known[sid] || r.isRecent(sid) {
			continue
		}
		r.mu.Lock()
		first, ok := r.unknown[node][sid]
		r.mu.Unlock()
		if !ok {
			first = now
		}
		seen[sid] = first
		if now.Sub(first) >= strayGrace {
			kill = append(kill, sid)
		}
	}
	r.mu.Lock()
	if len(seen) == 0 {
		delete(r.unknown, node)
	} else {
		r.unknown[node] = seen
	}
	r.mu.Unlock()
	sort.Strings(kill)
	return kill
}

func (r *Registry) isRecent(sandboxID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.recent[sandboxID]
	if ok && r.cfg.Clock.Since(t) > r.cfg.Recent {
		delete(r.recent, sandboxID)
		return false
	}
	return ok
}
