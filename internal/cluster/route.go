package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/nodeapi"
)

var (
	_ master.Node           = (*Registry)(nil)
	_ master.NetworkUpdater = (*Registry)(nil)
)

// candidatesLocked snapshots the nodes for the scheduler; fetchable says
// the server can ship the template to nodes that lack it.
func (r *Registry) candidatesLocked(template string, fetchable bool) []Candidate {
	out := make([]Candidate, 0, len(r.nodes))
	for _, n := range r.nodes {
		c := Candidate{
			ID: n.rec.ID, State: n.state(), CPU: n.rec.Capacity.CPUCount, MemoryMB: n.rec.Capacity.MemoryMB,
			MaxSBX: n.rec.Capacity.MaxSandboxes, MaxCreates: n.rec.Capacity.MaxCreates,
			UsedCPU: n.usedCPU, UsedMemMB: n.usedMemMB, Sandboxes: n.count, Inflight: n.inflight, Fetchable: fetchable,
		}
		for _, t := range n.rec.Templates {
			if t.Name == template {
				c.HasTemplate = true
			}
		}
		out = append(out, c)
	}
	return out
}

// reserve picks a node for req and accounts for the sandbox at once, so
// concurrent creates never oversubscribe a node. release(ok) ends the
// in-flight create; on failure it returns the capacity.
func (r *Registry) reserve(sandboxID string, req Request, fetchable bool) (*node, func(ok bool), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id, err := Pick(r.candidatesLocked(req.Template, fetchable), req)
	if err != nil {
		return nil, nil, err
	}
	n := r.nodes[id]
	n.inflight++
	n.usedCPU += req.CPU
	n.usedMemMB += req.MemoryMB
	r.recent[sandboxID] = time.Now()
	r.holds[sandboxID] = hold{node: id, cpu: req.CPU, memMB: req.MemoryMB, at: time.Now()}
	return n, func(ok bool) {
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

// CreateSandbox schedules a sandbox onto a node and creates it there.
func (r *Registry) CreateSandbox(ctx context.Context, req cubelet.CreateRequest) (cubelet.Sandbox, error) {
	tpl, err := r.Template(ctx, req.Template)
	if err != nil {
		return cubelet.Sandbox{}, err
	}
	cpu, mem := req.CPUCount, req.MemoryMB
	if cpu <= 0 {
		cpu = tpl.CPUCount
	}
	if mem <= 0 {
		mem = tpl.MemoryMB
	}
	_, serr := r.serverTemplate(ctx, req.Template)
	n, release, err := r.reserve(req.SandboxID, Request{Template: req.Template, CPU: cpu, MemoryMB: int64(mem)}, serr == nil)
	if err != nil {
		return cubelet.Sandbox{}, err
	}
	sb, err := n.client.CreateSandbox(ctx, req)
	release(err == nil)
	if err != nil {
		return cubelet.Sandbox{}, fmt.Errorf("node %s: %w", n.rec.ID, err)
	}
	sb.NodeID = n.rec.ID
	return sb, nil
}

// nodeOf finds the node running a sandbox.
func (r *Registry) nodeOf(ctx context.Context, sandboxID string) (*node, error) {
	sb, err := r.index.GetSandbox(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[sb.NodeID]
	if !ok {
		return nil, fmt.Errorf("sandbox %s is on unknown node %q: %w", sandboxID, sb.NodeID, errdefs.ErrNotFound)
	}
	return n, nil
}

// liveClient returns the client of the sandbox's node, or ErrUnavailable
// when that node is Down.
func (r *Registry) liveClient(ctx context.Context, sandboxID string) (*node, *nodeapi.Client, error) {
	n, err := r.nodeOf(ctx, sandboxID)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	down, cl := n.down, n.client
	r.mu.Unlock()
	if down {
		return n, nil, fmt.Errorf("node %s of sandbox %s is down: %w", n.rec.ID, sandboxID, errdefs.ErrUnavailable)
	}
	return n, cl, nil
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
	n, cl, err := r.liveClient(ctx, id)
	if err != nil {
		if n != nil {
			return nil
		}
		return err
	}
	if err := cl.KillSandbox(ctx, id); err != nil {
		return err
	}
	return r.recount(ctx)
}

// SandboxAddr returns node data IP : host port for a sandbox's guest port.
func (r *Registry) SandboxAddr(ctx context.Context, id string, port uint16) (string, error) {
	n, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return "", err
	}
	hp, err := cl.HostPort(ctx, id, port)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(n.rec.DataIP, strconv.Itoa(int(hp))), nil
}

// SandboxMetrics reads a sandbox's counters on its node.
func (r *Registry) SandboxMetrics(ctx context.Context, id string) (cubelet.Metrics, error) {
	_, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return cubelet.Metrics{}, err
	}
	return cl.SandboxMetrics(ctx, id)
}

// PauseSandbox freezes a sandbox on its node.
func (r *Registry) PauseSandbox(ctx context.Context, id string) error {
	_, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return err
	}
	return cl.PauseSandbox(ctx, id)
}

// ResumeSandbox thaws a sandbox on its node.
func (r *Registry) ResumeSandbox(ctx context.Context, id string) error {
	_, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return err
	}
	return cl.ResumeSandbox(ctx, id)
}

// UpdateNetwork changes a sandbox's egress policy on its node.
func (r *Registry) UpdateNetwork(ctx context.Context, id string, p master.NetworkPolicy) error {
	if p.Network.EgressProxy != nil || len(p.Network.Rules) > 0 {
		return fmt.Errorf("network.egressProxy and network.rules are not supported by this node: %w", errdefs.ErrNotImplemented)
	}
	_, cl, err := r.liveClient(ctx, id)
	if err != nil {
		return err
	}
	return cl.UpdateEgress(ctx, id, p.AllowInternet, p.Network.AllowOut, p.Network.DenyOut)
}

// Template reports a template's defaults: from the server's registry (it
// can ship it to any node), else from any node that has it.
func (r *Registry) Template(ctx context.Context, name string) (master.TemplateInfo, error) {
	if t, err := r.serverTemplate(ctx, name); err == nil {
		return master.TemplateInfo{Name: t.Name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.nodes {
		for _, t := range n.rec.Templates {
			if t.Name == name {
				return master.TemplateInfo{Name: t.Name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB}, nil
			}
		}
	}
	return master.TemplateInfo{}, fmt.Errorf("template %q is on no node and not on the server: %w", name, errdefs.ErrNotFound)
}

func (r *Registry) serverTemplate(ctx context.Context, name string) (TemplateRef, error) {
	if r.cfg.Templates == nil {
		return TemplateRef{}, errdefs.ErrNotFound
	}
	return r.cfg.Templates.ServerTemplate(ctx, name)
}
