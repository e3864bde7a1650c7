package cubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

// ReconcileReport says what one reconcile pass did.
type ReconcileReport struct {
	Adopted   []string // live sandboxes kept
	Rebuilt   []string // live sandboxes whose lost record was rebuilt from the state dir
	Dead      []string // recorded sandboxes that were dead or half-made, removed
	Repaired  int      // missing mappings re-added for live sandboxes
	Orphans   []string // kernel objects or state nobody owned, removed
	Bad       []string // unreadable records, left for an operator
	PoolSlots int      // warm-pool slots kept
	Recycled  []string // warm-pool slots of another runtime (version or binaries), dropped to be made anew
	// Unprobed counts running sandboxes adopted without asking their
	// supervisor (the start-up pass of New: checkDeferred asks once the
	// cubelet serves). Included in Adopted.
	Unprobed int
	Duration time.Duration // wall time of the pass
}

// recordFile is the copy of a running sandbox's owner record kept in its
// state dir, so a lost node store can be rebuilt from what survived.
const recordFile = "record.json"

// Reconcile makes the node's kernel state and records agree: live sandboxes
// are re-adopted (a missing mapping is repaired), dead or half-created ones
// are torn down, and kernel objects with no live owner are removed. It runs
// once before the cubelet serves (New) and in the offline `cube node gc`
// and cleanup (GC, Cleanup), never beside creates and kills: while the
// cubelet serves, maintain does the part that can change (dead sandboxes,
// unfinished deletes). It is idempotent.
func (c *Cubelet) Reconcile(ctx context.Context) (ReconcileReport, error) {
	return c.reconcile(ctx, false)
}

// reconcile is Reconcile; with deferProbes, running sandboxes are adopted
// without probing their supervisors (one round trip each, the part of a
// restart that grew with the sandboxes: see checkDeferred).
func (c *Cubelet) reconcile(ctx context.Context, deferProbes bool) (ReconcileReport, error) {
	start := time.Now()
	st := newStepTimer()
	var rep ReconcileReport
	recs, bad := c.store.List()
	rep.Bad = bad
	owners := map[string]nodestore.Sandbox{}
	var slots []nodestore.Sandbox
	for _, r := range recs {
		owners[r.ID] = r
		if r.State == nodestore.StatePooled {
			slots = append(slots, r)
		}
	}
	// A lost store with live sandboxes: rebuild their records from state
	// dirs (named by the record's Runtime(): its id, or a slot's).
	names := runtimeNames(owners)
	for _, name := range c.stateDirIDs() {
		if names[name] {
			continue
		}
		if r, ok := c.rebuildRecord(ctx, name); ok && !names[r.ID] && c.store.Put(r) == nil {
			owners[r.ID] = r
			names[r.ID], names[name] = true, true
			rep.Rebuilt = append(rep.Rebuilt, r.ID)
		}
	}
	st.mark("records")
	mappings, err := c.dp.Mappings(ctx)
	if err != nil {
		return rep, fmt.Errorf("read mappings: %w", err)
	}
	egress, err := c.dp.EgressOwners(ctx)
	if err != nil {
		return rep, err
	}
	eps, err := c.dp.Endpoints(ctx)
	if err != nil {
		return rep, fmt.Errorf("read endpoints: %w", err)
	}
	attached := map[string]bool{}
	for _, ep := range eps {
		attached[ep.Owner] = ep.NetNSPath != "" && ep.LinkName != ""
	}
	st.mark("dataplane")
	rep.PoolSlots, rep.Recycled = c.reconcilePool(ctx, slots, attached)
	st.mark("pool")
	for _, s := range slots {
		if !c.isReady(s.ID) {
			delete(owners, s.ID)
		}
	}
	byPort := make(map[uint16]cubevs.Mapping, len(mappings)) // once, not per sandbox
	for _, m := range mappings {
		byPort[m.HostPort] = m
	}
	live := map[string]liveness{}
	if !deferProbes {
		live = c.livenessOfRunning(ctx, owners)
	}
	st.mark("probe")
	for id, r := range owners {
		if r.State == nodestore.StatePooled {
			continue
		}
		if r.State == nodestore.StateRunning && deferProbes {
			rep.Unprobed++
		} else if r.State == nodestore.StateRunning && live[id] == livenessUnknown {
			// A shim that does not answer (overloaded, stopped) still holds
			// a sandbox: keep it; the sweep of the running cubelet
			// (maintain) tries again.
			c.log.Warn("shim did not answer; keeping the sandbox", "sandbox", id)
		}
		if !keepRecord(r, live[id]) {
			unlock := c.lock(id)
			err := c.teardown(ctx, r)
			unlock()
			if err != nil {
				c.log.Warn("remove dead sandbox", "sandbox", id, "err", err)
			}
			delete(owners, id)
			rep.Dead = append(rep.Dead, id)
			continue
		}
		rep.Adopted = append(rep.Adopted, id)
		if !egress[r.Runtime()] {
			if err := c.dp.SetEgress(ctx, r.Runtime(), r.IP, egressOf(r)); err != nil {
				c.log.Warn("re-apply egress policy", "sandbox", id, "err", err)
			}
		}
		rep.Repaired += c.repairMappings(ctx, r, byPort)
	}
	st.mark("adopt")
	rep.Orphans = c.sweepOrphans(ctx, owners, mappings)
	st.mark("sweep")
	c.noteStrayPorts(ctx)
	st.mark("ports")
	rep.Duration = time.Since(start)
	c.log.Info("node reconciled", append([]any{"adopted", len(rep.Adopted), "unprobed", rep.Unprobed, "rebuilt", len(rep.Rebuilt), "dead", len(rep.Dead),
		"repaired", rep.Repaired, "recycled", len(rep.Recycled), "orphans", len(rep.Orphans), "bad", len(rep.Bad), "duration", rep.Duration}, st.attrs()...)...)
	return rep, nil
}

// noteStrayPorts records the host ports still mapped in the kernel without
// an owner record after the sweep (a removal failed), so allocation, which
// does not read the kernel's mappings after a Reconcile, never hands them
// out.
func (c *Cubelet) noteStrayPorts(ctx context.Context) {
	maps, err := c.dp.Mappings(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.reconciled = false
		return
	}
	recs, _ := c.store.List()
	owned := map[uint16]bool{}
	for _, r := range recs {
		for _, hp := range r.Ports {
			owned[hp] = true
		}
	}
	stray := map[uint16]bool{}
	for _, m := range maps {
		if !owned[m.HostPort] {
			stray[m.HostPort] = true
		}
	}
	c.holdStrayPorts(stray)
	c.reconciled = true
}

// runtimeNames is the set of runtime names (state dirs, cgroups) owned by
// records: each record's id and, for a sandbox made from a pre-started
// slot, its RuntimeID.
func runtimeNames(owners map[string]nodestore.Sandbox) map[string]bool {
	names := make(map[string]bool, len(owners))
	for id, r := range owners {
		names[id] = true
		names[r.Runtime()] = true
	}
	return names
}

// repairMappings re-adds any of r's mappings missing from the kernel
// (have: the kernel's, by host port) and returns how many it repaired.
func (c *Cubelet) repairMappings(ctx context.Context, r nodestore.Sandbox, have map[uint16]cubevs.Mapping) int {
	n := 0
	for guest, hp := range r.Ports {
		if m, ok := have[hp]; ok && m.Owner == r.Runtime() && m.GuestPort == guest && m.SandboxIP == r.IP {
			continue
		}
		if m, ok := have[hp]; ok && m.Owner != r.Runtime() {
			// The host port is held by a stale owner; it loses to the live one.
			c.dp.RemoveMapping(ctx, hp)
		}
		if err := c.dp.AddMapping(ctx, cubevs.Mapping{Owner: r.Runtime(), HostPort: hp, SandboxIP: r.IP, GuestPort: guest}); err != nil {
			c.log.Warn("repair mapping", "sandbox", r.ID, "hostPort", hp, "err", err)
			continue
		}
		n++
	}
	return n
}

// sweepOrphans removes kernel objects and state dirs whose owner is not live.
func (c *Cubelet) sweepOrphans(ctx context.Context, owners map[string]nodestore.Sandbox, mappings []cubevs.Mapping) []string {
	// Dataplane objects (mappings, endpoints, egress chains) are owned by a
	// record's runtime name (Runtime(): its id for a cold create, the slot's
	// for a sandbox made from a pool slot).
	byRuntime := make(map[string]nodestore.Sandbox, len(owners))
	for _, r := range owners {
		byRuntime[r.Runtime()] = r
	}
	var orphans []string
	for _, m := range mappings {
		r, ok := byRuntime[m.Owner]
		if ok && r.Ports[m.GuestPort] == m.HostPort {
			continue
		}
		if err := c.dp.RemoveMapping(ctx, m.HostPort); err == nil {
			orphans = append(orphans, fmt.Sprintf("mapping %d (owner %s)", m.HostPort, m.Owner))
		}
	}
	names := runtimeNames(owners)
	if eps, err := c.dp.Endpoints(ctx); err == nil {
		for _, ep := range eps {
			if names[ep.Owner] {
				continue
			}
			if err := c.dp.Detach(ctx, ep.Owner); err == nil {
				orphans = append(orphans, "endpoint "+ep.Owner)
			}
		}
	}
	if ents, err := os.ReadDir(c.poolDir()); err == nil {
		for _, e := range ents {
			id := strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".json"), ".img")
			if r, ok := owners[id]; !ok || r.State != nodestore.StatePooled {
				os.Remove(filepath.Join(c.poolDir(), e.Name()))
				orphans = append(orphans, "pool file "+e.Name())
			}
		}
	}
	for _, id := range c.stateDirIDs() {
		if names[id] {
			continue
		}
		dir := c.sandboxDir(id)
		if sb, err := nsrt.Attach(ctx, dir); err == nil {
			sb.Kill(ctx)
		}
		if err := nsrt.Cleanup(ctx, dir, c.cfg.CgroupParent, id); err == nil {
			orphans = append(orphans, "state "+id)
		}
	}
	if ids, err := cgroup.List(c.cfg.CgroupParent); err == nil {
		for _, id := range ids {
			if names[id] || !validID(id) {
				continue
			}
			if cg, err := cgroup.Open(c.cfg.CgroupParent, id); err == nil {
				cg.Kill(ctx)
				if err := cg.Remove(ctx); err == nil {
					orphans = append(orphans, "cgroup "+id)
				}
			}
		}
	}
	return orphans
}

func (c *Cubelet) stateDirIDs() []string {
	ents, err := os.ReadDir(c.cfg.sandboxesDir())
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// rebuildRecord reads back the owner record of a live sandbox from its
// state dir (named by the record's Runtime()).
func (c *Cubelet) rebuildRecord(ctx context.Context, name string) (nodestore.Sandbox, bool) {
	data, err := os.ReadFile(filepath.Join(c.sandboxDir(name), recordFile))
	if err != nil {
		return nodestore.Sandbox{}, false
	}
	var r nodestore.Sandbox
	if err := json.Unmarshal(data, &r); err != nil || !validID(r.ID) || r.Runtime() != name || c.livenessOf(ctx, name) == livenessDead {
		return nodestore.Sandbox{}, false
	}
	return r, true
}

// writeRecordFile keeps the state dir's copy of the owner record current.
func (c *Cubelet) writeRecordFile(r nodestore.Sandbox) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	dir := c.sandboxDir(r.Runtime())
	tmp := filepath.Join(dir, recordFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, recordFile))
}

// putRecord writes the owner record to the node store and, for a running
// sandbox, refreshes the copy in its state dir.
func (c *Cubelet) putRecord(r nodestore.Sandbox) error {
	if err := c.store.Put(r); err != nil {
		return err
	}
	if r.State == nodestore.StateRunning {
		return c.writeRecordFile(r)
	}
	return nil
}
