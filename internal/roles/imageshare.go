package roles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
)

// imageStore is the control-plane store as image imports share their
// templates through it (store.Store implements it): with several server
// replicas, an image one replica imported is recorded there, so the other
// replicas neither pull it again nor answer 404 to a node fetching it.
type imageStore interface {
	HasLayer(ctx context.Context, digest string) (bool, error)
	PutLayer(ctx context.Context, digest string, r io.Reader) (stored bool, err error)
	GetTemplateRecord(ctx context.Context, name string) (store.TemplateRecord, error)
	PutTemplateRecord(ctx context.Context, rec store.TemplateRecord) error
}

var _ imageStore = store.Store(nil)

// recorded reports whether the store records tpl as a flat template of
// one layer that it holds: an image another replica imported.
func (m *registryImages) recorded(ctx context.Context, tpl string) (bool, error) {
	if m.shared == nil {
		return false, nil
	}
	rec, err := m.shared.GetTemplateRecord(ctx, tpl)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up template %s in the store: %w", tpl, err)
	}
	if len(rec.Layers) != 1 || rec.Layers[0].Digest != rec.Digest {
		return false, fmt.Errorf("template %s is recorded in the store with %d layers, not as an imported image; remove it (DELETE /templates/%s): %w",
			tpl, len(rec.Layers), tpl, errdefs.ErrConflict)
	}
	has, err := m.shared.HasLayer(ctx, rec.Digest)
	if err != nil {
		return false, fmt.Errorf("look up the layer of template %s in the store: %w", tpl, err)
	}
	return has, nil // a record without its layer (collected): import again
}

// share stores the image template t (flat: its rootfs is its one layer)
// in the store unless it is there already, and records it, so that every
// replica can ship it to nodes and reuse it for builds. A failure is
// logged, not returned: t stays usable through this replica.
func (m *registryImages) share(ctx context.Context, t template.Template, progress io.Writer) {
	if m.shared == nil {
		return
	}
	if err := m.shareErr(ctx, t, progress); err != nil {
		m.logger().Warn("imported image template stays on this server replica: storing it for the others failed",
			"template", t.Name, "err", err)
	}
}

func (m *registryImages) shareErr(ctx context.Context, t template.Template, progress io.Writer) error {
	rec, err := m.shared.GetTemplateRecord(ctx, t.Name)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	has, err := m.shared.HasLayer(ctx, t.Digest)
	if err != nil {
		return err
	}
	if has && rec.Digest == t.Digest && len(rec.Layers) == 1 {
		return nil
	}
	start := time.Now()
	if !has {
		fmt.Fprintf(progress, "storing template %s for the other server replicas\n", t.Name)
		if err := m.putLayer(ctx, t.Digest); err != nil {
			return err
		}
	}
	defaults, err := t.DefaultsJSON()
	if err != nil {
		return err
	}
	// No base (the layer is the whole rootfs) and no node: a server
	// replica imported it.
	if err := m.shared.PutTemplateRecord(ctx, store.TemplateRecord{
		Name: t.Name, Digest: t.Digest, Layers: []store.LayerRef{{Digest: t.Digest}},
		CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB, Defaults: defaults, CreatedAt: t.CreatedAt.UTC(),
	}); err != nil {
		return err
	}
	m.logger().Info("imported image template stored for the other server replicas", "template", t.Name, "digest", t.Digest,
		"layerCopied", !has, "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

// putLayer copies the layer digest (a template's rootfs in the registry)
// into the store as a tar stream.
func (m *registryImages) putLayer(ctx context.Context, digest string) error {
	dir, err := m.reg.LayerDir(ctx, digest)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(template.WriteLayerTar(ctx, dir, pw)) }()
	_, err = m.shared.PutLayer(ctx, digest, pr)
	pr.CloseWithError(errors.New("store stopped reading")) // ends the writer if the store returned early
	if err != nil {
		return fmt.Errorf("store layer %s: %w", digest, err)
	}
	return nil
}
