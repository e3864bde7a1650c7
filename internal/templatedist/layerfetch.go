package templatedist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
)

// errNoLayers marks a layered template the node cannot fetch by layers
// from this server: no template of the node holds its bottom layer and the
// server cannot provide one, or the server answers 404 for a layer (it
// lacks the layer routes or that layer). The whole rootfs is tried then.
var errNoLayers = errors.New("not fetchable by layers")

// fetchLayers registers ref's layered template from the node's template
// holding the longest prefix of ref.Layers plus the missing layers, each
// downloaded lazily from the replica at base. A template of one layer (a
// flat template the server holds only as a layer in the store, like an
// image imported by another replica) is that layer alone, on nothing.
func (f *Fetcher) fetchLayers(ctx context.Context, reg *template.Registry, base string, ref Meta) (template.Template, error) {
	start := time.Now()
	for _, l := range ref.Layers {
		if err := template.ValidateDigest(l.Digest); err != nil {
			return template.Template{}, fmt.Errorf("fetch template %q from %s: layer %w", ref.Name, base, err)
		}
	}
	var lower template.Template // the zero Template: an empty rootfs
	held, from := 0, "(nothing)"
	if len(ref.Layers) > 1 {
		var err error
		if lower, err = f.lowerOf(ctx, reg, base, ref); err != nil {
			return template.Template{}, fmt.Errorf("fetch template %q from %s by layers: %w", ref.Name, base, err)
		}
		held, from = len(lower.LayerChain()), lower.Name
	}
	missing := ref.Layers[held:]
	var bytes atomic.Int64
	sources := make([]template.LayerSource, len(missing))
	for i, l := range missing {
		sources[i] = template.LayerSource{Ref: l, Open: func(ctx context.Context) (io.ReadCloser, error) {
			return f.openLayer(ctx, base, l.Digest, &bytes)
		}}
	}
	t, err := reg.ImportLayers(ctx, ref.Name, lower, sources, template.Published{
		Digest: ref.Digest, XattrDigest: ref.XattrDigest, Defaults: ref.Defaults,
		CPUCount: ref.CPUCount, MemoryMB: ref.MemoryMB, DiskSizeMB: ref.DiskSizeMB,
		Layers: ref.Layers,
	})
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		// Another fetch won the race and registered it meanwhile.
		if t, err = reg.Get(ctx, ref.Name); err != nil {
			return template.Template{}, err
		}
		return sameDigest(t, ref.Digest)
	}
	if err != nil {
		return template.Template{}, fmt.Errorf("fetch template %q from %s by layers: %w", ref.Name, base, err)
	}
	f.logger().Info("fetched template by layers", "template", ref.Name, "from", from,
		"layers", len(missing), "bytes", bytes.Load(), "duration", time.Since(start), "server", base)
	return t, nil
}

// lowerOf returns the node's template to build ref's on: the one whose
// layer chain is the longest proper prefix of ref.Layers, else ref's base
// template fetched from the server (when its digest is the bottom layer).
func (f *Fetcher) lowerOf(ctx context.Context, reg *template.Registry, base string, ref Meta) (template.Template, error) {
	ts, err := reg.List(ctx)
	if err != nil {
		return template.Template{}, err
	}
	best, found := template.Template{}, 0
	for _, t := range ts {
		if n := len(t.LayerChain()); n > found && isPrefix(t.LayerChain(), ref.Layers) {
			best, found = t, n
		}
	}
	if found > 0 {
		return best, nil
	}
	if ref.BaseName == "" {
		return template.Template{}, fmt.Errorf("no template on this node has its bottom layer %s and the server names none: %w", ref.Layers[0].Digest, errNoLayers)
	}
	bt, err := f.fetchFrom(ctx, reg, base, ref.BaseName, false)
	if errors.Is(err, errdefs.ErrUnavailable) || ctx.Err() != nil {
		return template.Template{}, err
	}
	if err != nil {
		// The server lacks the base, or the node's copy differs.
		return template.Template{}, fmt.Errorf("bottom template %q: %w: %w", ref.BaseName, errNoLayers, err)
	}
	if !isPrefix(bt.LayerChain(), ref.Layers) {
		return template.Template{}, fmt.Errorf("bottom template %q has digest %s, the template's bottom layer is %s: %w",
			ref.BaseName, bt.Digest, ref.Layers[0].Digest, errNoLayers)
	}
	return bt, nil
}

// isPrefix reports whether chain is a proper prefix of layers (by digest).
func isPrefix(chain, layers []template.LayerRef) bool {
	if len(chain) == 0 || len(chain) >= len(layers) {
		return false
	}
	for i := range chain {
		if chain[i].Digest != layers[i].Digest {
			return false
		}
	}
	return true
}

// openLayer starts the download of one layer and checks the server sends
// the layer asked for; read bytes are added to n.
func (f *Fetcher) openLayer(ctx context.Context, base, digest string, n *atomic.Int64) (io.ReadCloser, error) {
	res, err := f.get(ctx, base+LayerPrefix+url.PathEscape(digest))
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("%w: %w", errNoLayers, err)
	}
	if err != nil {
		return nil, err
	}
	if got := res.Header.Get(LayerDigestHeader); got != digest {
		res.Body.Close()
		return nil, fmt.Errorf("server sent layer %q for layer %s: %w", got, digest, errdefs.ErrConflict)
	}
	return &countingBody{ReadCloser: &transportBody{res.Body}, n: n}, nil
}

func (f *Fetcher) logger() *slog.Logger {
	if f.Logger != nil {
		return f.Logger
	}
	return slog.Default()
}

// countingBody adds the bytes read to n.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	b.n.Add(int64(k))
	return k, err
}
