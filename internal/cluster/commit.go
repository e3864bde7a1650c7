package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// CommitSandbox registers the filesystem of a running WritableOnHost
// sandbox as a template on the node that runs it, and records at once that
// the node holds that template, so that creates of it are scheduled there
// without waiting for the node's next heartbeat (which then reports the
// same). With a LayerStore the server then ships it to other nodes as its
// base template plus layers (shipCommitted); otherwise it exists on that
// node only.
func (r *Registry) CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) (nodeproto.Template, error) {
	n, cl, err := r.liveClient(ctx, req.SandboxID)
	if err != nil {
		return nodeproto.Template{}, err
	}
	var t nodeproto.Template
	err = r.call(ctx, n, cl, func(cl *nodeapi.Client) (err error) {
		t, err = cl.CommitSandbox(ctx, req)
		return err
	})
	if err != nil {
		return nodeproto.Template{}, fmt.Errorf("node %s: %w", n.rec.ID, err)
	}
	ref := TemplateRef{Name: t.Name, Digest: t.Digest, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
		Layers: t.Layers, Defaults: json.RawMessage(t.DefaultsJSON)}
	if _, err := r.persist(ctx, n.rec.ID, func(rec *NodeRecord, found bool) error {
		if !found {
			return fmt.Errorf("node %s: %w", n.rec.ID, errdefs.ErrNotFound) // deleted meanwhile: write nothing
		}
		rec.Templates = withTemplate(rec.Templates, ref)
		return nil
	}); err != nil {
		// The template is made; the node's next heartbeat reports it.
		r.log.Warn("record committed template", "node", n.rec.ID, "template", t.Name, "err", err)
	}
	r.shipCommitted(ctx, n, cl, t)
	return t, nil
}

// withTemplate returns refs with ref in place of the template of its name,
// or added, sorted by name as nodes report them.
func withTemplate(refs []TemplateRef, ref TemplateRef) []TemplateRef {
	out := slices.DeleteFunc(slices.Clone(refs), func(t TemplateRef) bool { return t.Name == ref.Name })
	out = append(out, ref)
	slices.SortFunc(out, func(a, b TemplateRef) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// NodeTemplates lists the templates nodes report, one entry per name (the
// first node's), sorted by name.
func (r *Registry) NodeTemplates() []TemplateRef {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	var out []TemplateRef
	for _, n := range r.nodes {
		for _, t := range n.rec.Templates {
			if !seen[t.Name] {
				seen[t.Name] = true
				out = append(out, t)
			}
		}
	}
	slices.SortFunc(out, func(a, b TemplateRef) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// DeleteTemplate removes template name from every node that reports it
// and from their records. A node running a sandbox of it refuses
// (FailedPrecondition); the others have deleted theirs by then. When all
// holders deleted it, its store record goes too (the server no longer
// ships it). It returns errdefs.ErrNotFound when no node reports the
// template and the store has no record of it.
func (r *Registry) DeleteTemplate(ctx context.Context, name string) error {
	r.mu.Lock()
	var holders []*node
	for _, n := range r.nodes {
		if slices.ContainsFunc(n.rec.Templates, func(t TemplateRef) bool { return t.Name == name }) {
			holders = append(holders, n)
		}
	}
	r.mu.Unlock()
	if len(holders) == 0 {
		// Maybe shipped as layers while its nodes are gone.
		if recorded, err := r.forgetShipped(ctx, name); recorded || err != nil {
			return err
		}
		return fmt.Errorf("template %q is on no node: %w", name, errdefs.ErrNotFound)
	}
	var errs []error
	for _, n := range holders {
		r.mu.Lock()
		down, cl := n.down, n.client
		r.mu.Unlock()
		if down {
			errs = append(errs, fmt.Errorf("node %s holds template %q and is down: %w", n.rec.ID, name, errdefs.ErrUnavailable))
			continue
		}
		err := r.call(ctx, n, cl, func(cl *nodeapi.Client) error { return cl.DeleteTemplate(ctx, name) })
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, fmt.Errorf("node %s: %w", n.rec.ID, err))
			continue
		}
		if _, err := r.persist(ctx, n.rec.ID, func(rec *NodeRecord, found bool) error {
			if !found {
				return fmt.Errorf("node %s: %w", n.rec.ID, errdefs.ErrNotFound)
			}
			rec.Templates = slices.DeleteFunc(slices.Clone(rec.Templates), func(t TemplateRef) bool { return t.Name == name })
			return nil
		}); err != nil {
			r.log.Warn("record deleted template", "node", n.rec.ID, "template", name, "err", err)
		}
	}
	if len(errs) > 0 {
		// Some node keeps it (a sandbox of it runs there): so does the
		// store, and the template stays whole.
		return errors.Join(errs...)
	}
	_, err := r.forgetShipped(ctx, name)
	return err
}
