package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cube-dev/cube/internal/errdefs"
)

// A template is a stack of read-only layers, bottom first. A flat template
// (imported from a directory, a tar, an image, built with debootstrap or
// fetched whole) is one layer: its rootfs, whose digest is the template's
// Digest. A layered template (a commit of a build sandbox) is its parent's
// stack plus a top layer kept in <name>/layer: the difference between the
// parent's rootfs and its own (see makeLayer for what a layer directory
// holds). A layer's digest is Digest of its directory, so a flat template's
// rootfs digest is also its layer digest.

// layerDir is the name of a layered template's top layer directory, next
// to its rootfs.
const layerDir = "layer"

// whPrefix marks a whiteout in a layer directory: an empty regular file
// .wh.NAME says NAME of the layers below is gone (OCI naming). Opaque
// markers (.wh..wh..opq) are never made and are refused.
const (
	whPrefix = ".wh."
	whOpaque = whPrefix + whPrefix + ".opq"
)

// LayerRef names one layer of a template's stack (bottom first).
type LayerRef struct {
	Digest string `json:"digest"`         // "sha256:<64 hex>", template.Digest of the layer directory
	Size   int64  `json:"size,omitempty"` // bytes of the layer's regular files; 0 when unknown (flat bottom layer)
}

// LayerChain returns t's layer stack, bottom first: t.Layers, or its
// rootfs as the one layer of a flat template.
func (t Template) LayerChain() []LayerRef {
	if len(t.Layers) > 0 {
		return append([]LayerRef(nil), t.Layers...)
	}
	return []LayerRef{{Digest: t.Digest}}
}

// TopLayerDir is the directory holding t's top layer: <dir>/layer for a
// layered template, t.RootfsPath for a flat one.
func (t Template) TopLayerDir() string {
	if len(t.Layers) == 0 || t.RootfsPath == "" {
		return t.RootfsPath
	}
	return filepath.Join(filepath.Dir(t.RootfsPath), layerDir)
}

// LayerDir returns a directory holding the layer with that digest: the top
// layer dir of a registered template whose top layer has that digest (a
// flat template's rootfs counts). errdefs.ErrNotFound else. The directory
// is read-only; it disappears when its template is deleted.
func (r *Registry) LayerDir(ctx context.Context, digest string) (string, error) {
	if err := ValidateDigest(digest); err != nil {
		return "", fmt.Errorf("layer: %w", err)
	}
	ts, err := r.List(ctx)
	if err != nil {
		return "", err
	}
	for _, t := range ts {
		chain := t.LayerChain()
		if chain[len(chain)-1].Digest != digest {
			continue
		}
		dir := t.TopLayerDir()
		if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
			return dir, nil
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("layer %s of template %q: %w", digest, t.Name, err)
		}
	}
	return "", fmt.Errorf("layer %s: no template on this node has it as its top layer: %w", digest, errdefs.ErrNotFound)
}

// WriteLayerTar writes the layer directory dir as an uncompressed tar (the
// WriteTar format; whiteout markers are ordinary empty files named
// .wh.NAME). Deterministic for a given directory: lexical order, no access
// or change times, no user or group names.
func WriteLayerTar(ctx context.Context, dir string, w io.Writer) error {
	return writeTar(ctx, dir, w)
}

// LayerSource is one layer to import: its ref and a lazy opener of its tar
// (as WriteLayerTar wrote it).
type LayerSource struct {
	Ref  LayerRef
	Open func(ctx context.Context) (io.ReadCloser, error)
}

// sameChain reports whether a and b name the same layers (digests; sizes
// are informational).
func sameChain(a, b []LayerRef) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Digest != b[i].Digest {
			return false
		}
	}
	return true
}
