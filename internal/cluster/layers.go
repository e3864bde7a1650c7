package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// LayerStore keeps template layers and the records of templates the server
// ships as layers (the control-plane store implements it).
type LayerStore interface {
	HasLayer(ctx context.Context, digest string) (bool, error)
	PutLayer(ctx context.Context, digest string, r io.Reader) (stored bool, err error)
	PutTemplateRecord(ctx context.Context, rec store.TemplateRecord) error
	DeleteTemplateRecord(ctx context.Context, name string) error
}

// shipCommitted makes a template just committed on node n available to
// every node: it copies the template's top layer from n into the store
// (unless the store has it) and records the template, so that the server
// ships it to other nodes as the base template plus layers. A template
// without a layer stack (an older node), one whose bottom layer is no flat
// template n holds, or one named for its node only (the build step
// cache) stays on n, as does every template when the server keeps no
// layers; so does t when copying fails (logged: the commit stands and
// creates of t go to n).
func (r *Registry) shipCommitted(ctx context.Context, n *node, cl *nodeapi.Client, t nodeproto.Template) {
	if r.cfg.Layers == nil || len(t.Layers) < 2 || (r.cfg.KeepOnNode != nil && r.cfg.KeepOnNode(t.Name)) {
		return
	}
	base := r.flatTemplateOn(n, t.Layers[0])
	if base == "" {
		r.log.Info("committed template stays on its node: its bottom layer is no flat template there", "node", n.rec.ID, "template", t.Name)
		return
	}
	start := time.Now()
	top := t.Layers[len(t.Layers)-1]
	copied, err := r.copyLayer(ctx, n, cl, top)
	if err == nil {
		err = r.cfg.Layers.PutTemplateRecord(ctx, store.TemplateRecord{
			Name: t.Name, Digest: t.Digest, Layers: storeLayers(t.Layers), BaseName: base,
			CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
			Defaults: json.RawMessage(t.DefaultsJSON), Node: n.rec.ID, CreatedAt: r.cfg.Clock.Now().UTC(),
		})
	}
	if err != nil {
		r.log.Warn("committed template stays on its node: copying its top layer into the store failed", "node", n.rec.ID, "template", t.Name,
			"layer", top, "err", err)
		return
	}
	r.log.Info("committed template shipped as layers", "node", n.rec.ID, "template", t.Name, "base", base, "layers", len(t.Layers),
		"layer", top, "copied", copied, "duration", time.Since(start).Round(time.Millisecond))
}

// copyLayer copies layer digest from node n into the store unless it is
// there already; it reports whether it copied.
func (r *Registry) copyLayer(ctx context.Context, n *node, cl *nodeapi.Client, digest string) (bool, error) {
	if has, err := r.cfg.Layers.HasLayer(ctx, digest); err != nil || has {
		return false, err
	}
	err := r.call(ctx, n, cl, func(cl *nodeapi.Client) error {
		rc, err := cl.ReadLayer(ctx, digest)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = r.cfg.Layers.PutLayer(ctx, digest, rc)
		return err
	})
	return err == nil, err
}

// flatTemplateOn names a flat template on n whose digest is digest, or "".
func (r *Registry) flatTemplateOn(n *node, digest string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range n.rec.Templates {
		if t.Digest == digest && len(t.Layers) <= 1 {
			return t.Name
		}
	}
	return ""
}

// forgetShipped removes the record of a template the server ships as
// layers; it reports whether there was one.
func (r *Registry) forgetShipped(ctx context.Context, name string) (bool, error) {
	if r.cfg.Layers == nil {
		return false, nil
	}
	err := r.cfg.Layers.DeleteTemplateRecord(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("forget template %q in the store: %w", name, err)
	}
	return true, nil
}

func storeLayers(digests []string) []store.LayerRef {
	out := make([]store.LayerRef, len(digests))
	for i, d := range digests {
		out[i] = store.LayerRef{Digest: d}
	}
	return out
}
