package templatedist

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
)

// LayerPrefix is where the server serves layers by digest. Servers before
// layered templates answer 404 there; nodes then fetch the whole rootfs.
const LayerPrefix = "/cube/v1/layers/"

// LayerDigestHeader carries the layer digest on a layer response.
const LayerDigestHeader = "X-Cube-Layer-Digest"

// LayerStore is what templatedist needs of the control-plane store
// (store.Store implements it): the layers committed on nodes and the
// records of the templates made of them.
type LayerStore interface {
	OpenLayer(ctx context.Context, digest string) (io.ReadCloser, int64, error)
	GetTemplateRecord(ctx context.Context, name string) (store.TemplateRecord, error)
}

var _ LayerStore = store.Store(nil)

// serveLayers serves GET LayerPrefix{digest}: the layer from the store,
// else from the registry (the top layer of a template there; a flat
// template's rootfs is its only layer).
func serveLayers(mux *http.ServeMux, reg *template.Registry, layers LayerStore) {
	mux.HandleFunc("GET "+LayerPrefix+"{digest}", func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		digest := r.PathValue("digest")
		if err := template.ValidateDigest(digest); err != nil {
			writeErr(w, fmt.Errorf("layer: %w", err))
			return
		}
		if layers != nil {
			rc, size, err := layers.OpenLayer(ctx, digest)
			if err == nil {
				defer rc.Close()
				w.Header().Set("Content-Type", "application/x-tar")
				w.Header().Set(LayerDigestHeader, digest)
				w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
				if n, err := io.Copy(w, rc); err != nil || n != size {
					// Cut the connection: the node must see a truncated
					// stream, not a short one that looks complete.
					panic(http.ErrAbortHandler)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrNotFound) {
				writeErr(w, fmt.Errorf("layer %s: %w", digest, err))
				return
			}
		}
		dir, err := reg.LayerDir(ctx, digest)
		if err != nil {
			writeErr(w, fmt.Errorf("layer %s: %w", digest, err))
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set(LayerDigestHeader, digest)
		bw := bufio.NewWriterSize(w, 256<<10)
		if err := template.WriteLayerTar(ctx, dir, bw); err != nil {
			panic(http.ErrAbortHandler)
		}
		if err := bw.Flush(); err != nil {
			panic(http.ErrAbortHandler)
		}
	})
}

// recordMeta is the Meta of a template known only as a store record.
// Records carry no xattr digest: the node checks each layer's digest and
// the final rootfs digest, not the xattrs.
func recordMeta(ctx context.Context, layers LayerStore, name string) (Meta, error) {
	rec, err := layers.GetTemplateRecord(ctx, name)
	if err != nil {
		return Meta{}, err
	}
	m := Meta{
		TemplateRef: wireRef(refOfRecord(rec)),
		BaseName:    rec.BaseName,
	}
	for _, l := range rec.Layers {
		m.Layers = append(m.Layers, template.LayerRef{Digest: l.Digest, Size: l.Size})
	}
	d, err := template.ParseDefaults(rec.Defaults)
	if err != nil {
		return Meta{}, fmt.Errorf("template %q: stored defaults: %w", name, err)
	}
	m.Defaults = d
	return m, nil
}

// layersOnly turns notFound (the registry's answer for name) into a clear
// refusal when the store holds name as layers only: the server has no
// rootfs to stream, and building one per request would cost the server a
// full copy of the template; nodes of this version fetch the layers.
func layersOnly(ctx context.Context, layers LayerStore, name string, notFound error) error {
	rec, err := layers.GetTemplateRecord(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return notFound
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("template %q is stored on the server as %d layers only, not as a rootfs: fetch its layers from %s{digest} (cube nodes of this version do; upgrade older nodes): %w",
		name, len(rec.Layers), LayerPrefix, errdefs.ErrConflict)
}

// flatNamed returns the name of a flat template in reg with that digest
// ("base" first, the usual bottom), or "" when there is none.
func flatNamed(ctx context.Context, reg *template.Registry, digest string) (string, error) {
	if t, err := reg.Get(ctx, "base"); err == nil && len(t.Layers) == 0 && t.Digest == digest {
		return t.Name, nil
	}
	ts, err := reg.List(ctx)
	if err != nil {
		return "", err
	}
	for _, t := range ts {
		if len(t.Layers) == 0 && t.Digest == digest {
			return t.Name, nil
		}
	}
	return "", nil
}
