package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// layerDigestRE is the form of a layer digest (template.Digest's).
var layerDigestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// PutLayer stores the bytes of r (a layer's tar) as the layer digest. The
// store does not hash: a layer's digest is over its extracted tree, which
// the caller computed. The first complete write wins; a put of a digest
// already stored reads r to its end, drops it, marks the layer used now
// (so DeleteUnusedLayers spares it while its record is being written) and
// returns stored=false, as does a writer that loses the race to another.
// No transaction spans the copy, and the layer is visible (HasLayer,
// OpenLayer) only once complete: a put whose reader fails leaves nothing.
func (s *sqlStore) PutLayer(ctx context.Context, digest string, r io.Reader) (stored bool, err error) {
	if !layerDigestRE.MatchString(digest) {
		return false, fmt.Errorf("store layer: %w: digest %q is not sha256:<64 hex>", errdefs.ErrInvalidArgument, digest)
	}
	present, err := s.touchBlob(ctx, layerTables, digest)
	if err != nil {
		return false, err
	}
	if present {
		// Drained so that a caller feeding r from a pipe is not left
		// blocked; its error does not matter, the layer is stored.
		_, _ = io.Copy(io.Discard, r)
		return false, nil
	}
	return s.putBlob(ctx, layerTables, digest, r)
}

// OpenLayer returns a reader of the layer digest and its size in bytes;
// ErrNotFound when none is stored. It reads one chunk (ChunkSize) per
// query, under ctx, so a layer is never held in memory and no connection
// stays held between reads.
func (s *sqlStore) OpenLayer(ctx context.Context, digest string) (io.ReadCloser, int64, error) {
	return s.openBlob(ctx, layerTables, digest)
}

// HasLayer reports whether the layer digest is stored (complete).
func (s *sqlStore) HasLayer(ctx context.Context, digest string) (bool, error) {
	return s.hasBlob(ctx, layerTables, digest)
}

// DeleteUnusedLayers removes the layers no template record references that
// were last stored or used (a repeated PutLayer, a PutTemplateRecord naming
// them) before olderThan, so a layer being recorded right now is kept, and
// the chunks of layer writes cut short that wrote nothing since olderThan.
// It returns the removed digests, sorted. Each removal is conditional on
// the layer still being unused, so replicas may run it at once.
func (s *sqlStore) DeleteUnusedLayers(ctx context.Context, olderThan time.Time) ([]string, error) {
	out, err := s.deleteBlobs(ctx, layerTables,
		`used_at < ? AND NOT EXISTS (SELECT 1 FROM template_record_layers r WHERE r.digest = layers.digest)`, toNanos(olderThan))
	return out, errors.Join(err, s.deleteOrphanChunks(ctx, layerTables, olderThan))
}
