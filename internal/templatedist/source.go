package templatedist

import (
	"context"
	"errors"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
)

var _ cluster.TemplateSource = Source{}

// Source tells the scheduler which templates the server can ship: those in
// its own registry (usually <server data-dir>/templates), read per call,
// and, when Layers is set, those recorded in the control-plane store as
// layers (committed on a node; NewHandler serves their layers).
type Source struct {
	Registry *template.Registry
	Layers   LayerStore
}

// ServerTemplate returns the server's template called name, or an error
// wrapping errdefs.ErrNotFound when the server lacks it.
func (s Source) ServerTemplate(ctx context.Context, name string) (cluster.TemplateRef, error) {
	t, err := s.Registry.Get(ctx, name)
	if err == nil {
		ref := refOf(t)
		if len(ref.Layers) > 1 {
			if ref.Base, err = flatNamed(ctx, s.Registry, ref.Layers[0]); err != nil {
				return cluster.TemplateRef{}, err
			}
		}
		return ref, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) || s.Layers == nil {
		return cluster.TemplateRef{}, err
	}
	rec, rerr := s.Layers.GetTemplateRecord(ctx, name)
	if errors.Is(rerr, errdefs.ErrNotFound) {
		return cluster.TemplateRef{}, err
	}
	if rerr != nil {
		return cluster.TemplateRef{}, rerr
	}
	return refOfRecord(rec), nil
}

// refOfRecord is the part of a template record the scheduler uses.
func refOfRecord(rec store.TemplateRecord) cluster.TemplateRef {
	ref := cluster.TemplateRef{Name: rec.Name, Digest: rec.Digest, CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, DiskSizeMB: rec.DiskSizeMB, Base: rec.BaseName}
	for _, l := range rec.Layers {
		ref.Layers = append(ref.Layers, l.Digest)
	}
	return ref
}
