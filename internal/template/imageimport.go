package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/ocilayer"
)

// ImportImage registers a template called name from a container image: its
// layers are applied in order (see package ocilayer) into a fresh rootfs,
// which is then prepared like any import (users root and user, mount points,
// network files), and the image config's Env, WorkingDir, USER, Entrypoint
// and Cmd become the template's Defaults. The image is read only once the
// name lock is held and name is free. Errors wrap errdefs kinds: NotFound
// (no such image or platform), InvalidArgument (corrupt or unsafe layers),
// FailedPrecondition (plain HTTP without InsecureRegistry), Unauthenticated,
// Conflict (a layer whose content does not match its digest), Unavailable.
func (r *Registry) ImportImage(ctx context.Context, name string, src ImageSource) (Template, error) {
	if (src.Ref == "") == (src.Path == "") {
		return Template{}, fmt.Errorf("import image: give either a registry reference or a path: %w", errdefs.ErrInvalidArgument)
	}
	var cfg *v1.Config
	return r.registerSpec(ctx, name, buildSpec{
		fill: func(ctx context.Context, rootfs string) (string, error) {
			scratch := filepath.Join(filepath.Dir(rootfs), "scratch")
			if err := os.Mkdir(scratch, 0o700); err != nil {
				return "", err
			}
			defer removeTree(scratch)
			img, source, err := resolveImage(ctx, src, scratch)
			if err != nil {
				return "", err
			}
			cf, err := img.ConfigFile()
			if err != nil {
				return "", fmt.Errorf("%s: read image config: %v: %w", source, err, errdefs.ErrInvalidArgument)
			}
			cfg = &cf.Config
			if src.Progress != nil {
				fmt.Fprintf(src.Progress, "cube: template %s: image %s\n", name, source)
			}
			if err := applyLayers(ctx, img, cf, rootfs, src.Progress); err != nil {
				return "", fmt.Errorf("%s: %w", source, err)
			}
			return source, nil
		},
		finish: func(ctx context.Context, rootfs string, t *Template) error {
			d, err := imageDefaults(rootfs, cfg)
			if err != nil {
				return err
			}
			t.Defaults = d
			return nil
		},
	})
}

// applyLayers applies img's layers in order, each checked while it streams
// against the diff id the image config lists for it (the config is what
// the image's digest names; a layer's own DiffID() may be computed from
// its content and prove nothing).
func applyLayers(ctx context.Context, img v1.Image, cf *v1.ConfigFile, rootfs string, progress io.Writer) error {
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("read layers: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return fmt.Errorf("image has %d layers but its config lists %d: %w", len(layers), len(cf.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	for i, l := range layers {
		if progress != nil {
			fmt.Fprintf(progress, "cube: layer %d/%d %s\n", i+1, len(layers), cf.RootFS.DiffIDs[i])
		}
		if err := applyLayer(ctx, l, cf.RootFS.DiffIDs[i], rootfs); err != nil {
			return fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
	}
	return nil
}

func applyLayer(ctx context.Context, l v1.Layer, diffID v1.Hash, rootfs string) error {
	if diffID.Algorithm != "sha256" {
		return fmt.Errorf("diff id %s: only sha256 is supported: %w", diffID, errdefs.ErrInvalidArgument)
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return fmt.Errorf("open %s: %w", diffID, err)
	}
	defer rc.Close()
	h := sha256.New()
	rd := io.TeeReader(rc, h)
	if _, err := ocilayer.Apply(ctx, rootfs, rd, ocilayer.Options{}); err != nil {
		return fmt.Errorf("apply %s: %w", diffID, err)
	}
	// The tar may end before the stream does (padding); reading to the end
	// also makes a registry blob check its own digest.
	if _, err := io.Copy(io.Discard, rd); err != nil {
		if strings.Contains(err.Error(), "checksum") {
			return fmt.Errorf("read %s: %v: %w", diffID, err, errdefs.ErrConflict)
		}
		return fmt.Errorf("read %s: %w", diffID, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID.String() {
		return fmt.Errorf("layer content has digest %s, the image config says %s (corrupt or tampered; nothing registered): %w", got, diffID, errdefs.ErrConflict)
	}
	return nil
}
