package cubelet

import (
	"context"
	"fmt"
	"io"

	"github.com/cube-dev/cube/internal/template"
)

// ReadLayer writes the tar of the template layer with that digest (the top
// layer of a template on this node, or a flat template's rootfs) to w; an
// unknown layer is errdefs.ErrNotFound before anything is written. The
// server copies a committed template's top layer with it, so that other
// nodes can make the template from its parent plus that layer.
func (c *Cubelet) ReadLayer(ctx context.Context, digest string, w io.Writer) error {
	if err := template.ValidateDigest(digest); err != nil {
		return err
	}
	dir, err := c.templates.LayerDir(ctx, digest)
	if err != nil {
		return err
	}
	if err := template.WriteLayerTar(ctx, dir, w); err != nil {
		return fmt.Errorf("layer %s: %w", digest, err)
	}
	return nil
}

// LayerDigests lists the digests of t's layer stack, bottom first, as the
// node protocol carries them.
func LayerDigests(t template.Template) []string {
	chain := t.LayerChain()
	out := make([]string, len(chain))
	for i, l := range chain {
		out[i] = l.Digest
	}
	return out
}
