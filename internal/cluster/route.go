package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

var (
	_ master.Node           = (*Registry)(nil)
	_ master.NetworkUpdater = (*Registry)(nil)
)

// candidatesLocked snapshots the nodes for the scheduler; sup says how
// nodes that lack the template can get it.
func (r *Registry) candidatesLocked(template string, sup supply) []Candidate {
	out := make([]Candidate, 0, len(r.nodes))
	for _, n := range r.nodes {
		c := Candidate{
			ID: n.rec.ID, State: n.state(), CPU: n.rec.Capacity.CPUCount, MemoryMB: n.rec.Capacity.MemoryMB,
			MaxSBX: n.rec.Capacity.MaxSandboxes, MaxCreates: n.rec.Capacity.MaxCreates,
			UsedCPU: n.usedCPU, UsedMemMB: n.usedMemMB, Sandboxes: n.count, Inflight: n.inflight,
			MemReserveMB: n.rec.Capacity.MemoryReserveMB, Usage: n.usage,
		}
		for _, t := range n.rec.Templates {
			if t.Name == template {
				c.HasTemplate = true
			}
		}
		c.LayersHeld, c.LayersTotal = heldLayers(n.rec.Templates, sup.layers), len(sup.layers)
		c.Fetchable = sup.fetchableBy(c.LayersHeld)
		out = append(out, c)
	}
	return out
}

// reserve picks a node for req and accounts for the sandbox at once, so
// concurrent creates never oversubscribe a node. release(ok) ends the
// in-flight create; on failure it returns the capacity.
func (r *Registry) reserve(sandboxID string, req Request, sup supply) (*node, *nodeapi.Client, func(ok bool), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, err := Pick(r.candidatesLocked(req.Template, sup), req)
	if err != nil {
		return nil, nil, nil, err
	}
	n := r.nodes[id]
	n.inflight++
	n.usedCPU += req.CPU
	n.usedMemMB += req.MemoryMB
	r.recent[sandboxID] = r.cfg.Clock.Now()
	r.holds[sandboxID] = hold{node: id, cpu: req.CPU, memMB: req.MemoryMB, at: r.cfg.Clock.Now()}
	return n, n.client, func(ok bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		n.inflight--
		if ok {
			n.count++
			if h, held := r.holds[sandboxID]; held {
				h.created = true
				r.holds[sandboxID] = h
			}
			return
		}
		delete(r.holds, sandboxID)
		n.usedCPU -= req.CPU
		n.usedMemMB -= req.MemoryMB
	}, nil
}

// call runs fn with a node's client. A node that answers Unauthenticated
// may have re-registered with a new token (or address) through another
// replica: re-read its record and, if the client changed, run fn once more
// with the new one. A call refused for its token did nothing on the node,
// so running it again is safe.
func (r *Registry) call(ctx context.Context, n *node, cl *nodeapi.Client, fn func(*nodeapi.Client) error) error {
	err := fn(cl)
	if errors.Is(err, errdefs.ErrUnavailable) {
		// The node may have moved (a new Pod with another address, e.g.
		// after a hostNetwork change) and registered through another
		// replica: the old address refuses connections. Retry at the new
		// one; the old address never took the call.
		if fresh, changed := r.reloadClient(ctx, n, cl); changed {
			r.log.Info("node moved (registered through another replica); retrying at its new address", "node", n.rec.ID)
			return fn(fresh)
		}
		return err
	}
	if !errors.Is(err, errdefs.ErrUnauthenticated) {
		return err
	}
	fresh, changed := r.reloadClient(ctx, n, cl)
	if changed {
		r.log.Info("node re-registered through another replica; retrying with its new token", "node", n.rec.ID)
		if err = fn(fresh); !errors.Is(err, errdefs.ErrUnauthenticated) {
			return err
		}
	}
	// The node refuses the token its stored record holds: it has restarted
	// and not registered again yet (its next attempt fixes it), or it
	// registered with another server. The caller's own credentials are
	// fine, so this must not reach the API as a 401 (the SDK would report a
	// bad API key): the node is unavailable for now.
	return fmt.Errorf("node %s: %v (it restarted and has not registered again yet; retry): %w", n.rec.ID, err, errdefs.ErrUnavailable)
}

// reloadClient re-reads the node records and returns n's client if it is
// no longer old.
func (r *Registry) reloadClient(ctx context.Context, n *node, old *nodeapi.Client) (*nodeapi.Client, bool) {
	if err := r.Refresh(ctx); err != nil {
		r.log.Warn("re-read node record", "node", n.rec.ID, "err", err)
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n.client == old {
		return nil, false
	}
	return n.client, true
}

// CreateSandbox schedules a sandbox onto a node and creates it there.
func (r *Registry) CreateSandbox(ctx context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error) {
	tpl, sup, err := r.lookupTemplate(ctx, req.Template)
	if err != nil {
		return nodeproto.Sandbox{}, err
	}
	cpu, mem := req.CPUCount, req.MemoryMB
	if cpu <= 0 {
		cpu = tpl.CPUCount
	}
	if mem <= 0 {
		mem = tpl.MemoryMB
	}
	// Schedule on the stored operator state (isolate, uncordon, drain may
	// have gone through another replica), not on the last Sync's.
	if err := r.Refresh(ctx); err != nil {
		return nodeproto.Sandbox{}, err
	}
	n, cl, release, err := r.reserve(req.SandboxID, Request{Template: req.Template, CPU: cpu, MemoryMB: int64(mem)}, sup)
	if err != nil {
		return nodeproto.Sandbox{}, err
	}
	var sb nodeproto.Sandbox
	err = r.call(ctx, n, cl, func(cl *nodeapi.Client) (err error) {
		sb, err = cl.CreateSandbox(ctx, req)
		return err
	})
	release(err == nil)
	if err != nil {
		return nodeproto.Sandbox{}, fmt.Errorf("node %s: %w", n.rec.ID, err)
	}
	sb.NodeID = n.rec.ID
	return sb, nil
}

// nodeOf finds the node running a sandbox, and the sandbox's record.
func (r *Registry) nodeOf(ctx context.Context, sandboxID string) (*node, store.Sandbox, error) {
	sb, err := r.index.GetSandbox(ctx, sandboxID)
	if err != nil {
		return nil, sb, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[sb.NodeID]
	if !ok {
		return nil, sb, fmt.Errorf("sandbox %s is on unknown node %q: %w", sandboxID, sb.NodeID, errdefs.ErrNotFound)
	}
	return n, sb, nil
}

// liveClient returns the client of the sandbox's node, or ErrUnavailable
// when that node is Down.
func (r *Registry) liveClient(ctx context.Context, sandboxID string) (*node, *nodeapi.Client, error) {
	n, _, cl, err := r.liveSandbox(ctx, sandboxID)
	return n, cl, err
}

// liveSandbox is liveClient that also returns the sandbox's record.
func (r *Registry) liveSandbox(ctx context.Context, sandboxID string) (*node, store.Sandbox, *nodeapi.Client, error) {
	n, sb, err := r.nodeOf(ctx, sandboxID)
	if err != nil {
		return nil, sb, nil, err
	}
	r.mu.Lock()
	down, cl := n.down, n.client
	r.mu.Unlock()
	if down {
		return n, sb, nil, fmt.Errorf("node %s of sandbox %s is down: %w", n.rec.ID, sandboxID, errdefs.ErrUnavailable)
	}
	return n, sb, cl, nil
}

// KillSandbox kills a sandbox on its node. A sandbox on a Down node is
// forgotten now and removed by the node's reconcile when it comes back
// (its heartbeat returns it in the kill list).
func (r *Registry) KillSandbox(ctx context.Context, id string) error {
	// Not recent any more: whatever the node reports for it from now on is
	// a leftover to remove (also when the node is Down and reports later).
	r.mu.Lock()
	delete(r.recent, id)
	delete(r.holds, id)
	r.mu.Unlock()
	n, sb, cl, err := r.liveSandbox(ctx, id)
	if err != nil {
		if n != nil {
			return nil
		}
		return err
	}
	if err := r.call(ctx, n, cl, func(cl *nodeapi.Client) error { return cl.KillSandbox(ctx, id) }); err != nil {
		return err
	}
	// Its capacity is free now: the master deletes the record next, and
	// a create right after this kill must not find the node full. (A full
	// recount here would read the whole sandbox table, the record still
	// in it, on every kill; heartbeats recount from the table anyway.)
	r.mu.Lock()
	n.usedCPU = max(n.usedCPU-sb.CPUCount, 0)
	n.usedMemMB = max(n.usedMemMB-int64(sb.MemoryMB), 0)
	n.count = max(n.count-1, 0)
	r.mu.Unlock()
	return nil
}

// SandboxAddr returns node data IP : host port for a sandbox's guest port.
func (r *Registry) SandboxAddr(ctx context.Context, id string, port uint16) (string, error) {
	n, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return "", err
	}
	var hp uint16
	err = r.call(ctx, n, cl, func(cl *nodeapi.Client) (err error) {
		hp, err = cl.HostPort(ctx, id, port)
		return err
	})
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(n.rec.DataIP, strconv.Itoa(int(hp))), nil
}

// SandboxMetrics reads a sandbox's counters on its node.
func (r *Registry) SandboxMetrics(ctx context.Context, id string) (nodeproto.Metrics, error) {
	n, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return nodeproto.Metrics{}, err
	}
	var m nodeproto.Metrics
	err = r.call(ctx, n, cl, func(cl *nodeapi.Client) (err error) {
		m, err = cl.SandboxMetrics(ctx, id)
		return err
	})
	return m, err
}

// PauseSandbox freezes a sandbox on its node.
func (r *Registry) PauseSandbox(ctx context.Context, id string) error {
	n, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return err
	}
	return r.call(ctx, n, cl, func(cl *nodeapi.Client) error { return cl.PauseSandbox(ctx, id) })
}

// ResumeSandbox thaws a sandbox on its node.
func (r *Registry) ResumeSandbox(ctx context.Context, id string) error {
	n, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return err
	}
	return r.call(ctx, n, cl, func(cl *nodeapi.Client) error { return cl.ResumeSandbox(ctx, id) })
}

// UpdateNetwork changes a sandbox's egress policy on its node.
func (r *Registry) UpdateNetwork(ctx context.Context, id string, p master.NetworkPolicy) error {
	if p.Network.EgressProxy != nil || len(p.Network.Rules) > 0 {
		return fmt.Errorf("network.egressProxy and network.rules are not supported by this node: %w", errdefs.ErrNotImplemented)
	}
	n, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return err
	}
	return r.call(ctx, n, cl, func(cl *nodeapi.Client) error {
		return cl.UpdateEgress(ctx, id, p.AllowInternet, p.Network.AllowOut, p.Network.DenyOut)
	})
}

// Template reports a template's defaults: from the server's registry (it
// can ship it to any node), else from any node that has it.
func (r *Registry) Template(ctx context.Context, name string) (master.TemplateInfo, error) {
	t, _, err := r.lookupTemplate(ctx, name)
	return t, err
}

// lookupTemplate is Template, also reporting how nodes that lack the
// template can get it from the server.
func (r *Registry) lookupTemplate(ctx context.Context, name string) (tpl master.TemplateInfo, sup supply, err error) {
	t, serr := r.serverTemplate(ctx, name)
	if serr == nil {
		return master.TemplateInfo{Name: t.Name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB}, r.supplyOf(ctx, t), nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.nodes {
		for _, t := range n.rec.Templates {
			if t.Name == name {
				return master.TemplateInfo{Name: t.Name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB}, supply{}, nil
			}
		}
	}
	if !errors.Is(serr, errdefs.ErrNotFound) {
		// e.g. a built-in template still being built (503, try again).
		return master.TemplateInfo{}, supply{}, serr
	}
	return master.TemplateInfo{}, supply{}, fmt.Errorf("template %q is on no node and not on the server: %w", name, errdefs.ErrNotFound)
}

func (r *Registry) serverTemplate(ctx context.Context, name string) (TemplateRef, error) {
	if r.cfg.Templates == nil {
		return TemplateRef{}, errdefs.ErrNotFound
	}
	return r.cfg.Templates.ServerTemplate(ctx, name)
}
