package app

import (
	"context"
	"fmt"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/template"
)

// localNode adapts an in-process cubelet to the master's Node interface.
type localNode struct {
	*cubelet.Cubelet
	templates *template.Registry
}

var (
	_ master.Node           = localNode{}
	_ master.NetworkUpdater = localNode{}
)

// Template reports a template's defaults, or errdefs.ErrNotFound.
func (n localNode) Template(ctx context.Context, name string) (master.TemplateInfo, error) {
	t, err := n.templates.Get(ctx, name)
	if err != nil {
		return master.TemplateInfo{}, err
	}
	return master.TemplateInfo{Name: t.Name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB}, nil
}

// UpdateNetwork enforces a sandbox's egress rules on the node. Domain names,
// egress proxies and HTTP rules need an L7 egress proxy the node does not
// have yet: those are refused with errdefs.ErrNotImplemented (501).
func (n localNode) UpdateNetwork(ctx context.Context, id string, p master.NetworkPolicy) error {
	if p.Network.EgressProxy != nil || len(p.Network.Rules) > 0 {
		return fmt.Errorf("network.egressProxy and network.rules are not supported by this node: %w", errdefs.ErrNotImplemented)
	}
	allow, err := cubelet.ParsePrefixes(p.Network.AllowOut)
	if err != nil {
		return err
	}
	deny, err := cubelet.ParsePrefixes(p.Network.DenyOut)
	if err != nil {
		return err
	}
	return n.UpdateEgress(ctx, id, cubevs.EgressPolicy{AllowInternet: p.AllowInternet, AllowOut: allow, DenyOut: deny})
}
