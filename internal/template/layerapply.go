package template

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// LayersSource prefixes the Source recorded for templates imported with
// ImportLayers ("layers:<lower template>").
const LayersSource = "layers:"

// ImportLayers registers template name = lower plus layers (in order), with
// p's sizes, defaults and digest. lower.LayerChain() followed by the refs
// of layers must equal p.Layers (else ErrInvalidArgument). Each layer is
// opened only after the name lock is held and only if name is not
// registered yet (ErrAlreadyExists then, as ImportStream); each is
// extracted with the ImportTar safety rules (no "..", nothing outside the
// staging dir), and its Digest must equal its ref (else ErrConflict naming
// both); the final rootfs digest must equal p.Digest, and its XattrDigest
// p.XattrDigest when set (ErrConflict). Atomic like every registration: a
// failure leaves nothing. The top layer is kept as <name>/layer; the ones
// below live on only in the rootfs (hard links).
//
// lower may be the zero Template: the rootfs then starts empty and the
// bottom layer, a flat template's rootfs, is extracted into it as it is
// (its digest checked there, before the layers above are applied). A
// template made of that one layer is flat (no Layers in template.json),
// as the template it was shipped from is.
func (r *Registry) ImportLayers(ctx context.Context, name string, lower Template, layers []LayerSource, p Published) (Template, error) {
	if err := validatePublished(p); err != nil {
		return Template{}, fmt.Errorf("import template %q: %w", name, err)
	}
	if len(layers) == 0 {
		return Template{}, fmt.Errorf("import template %q: no layers to put on %q: %w", name, lowerName(lower), errdefs.ErrInvalidArgument)
	}
	empty := lower.Name == "" && lower.Digest == "" && lower.RootfsPath == "" && len(lower.Layers) == 0
	if lower.RootfsPath == "" && !empty {
		return Template{}, fmt.Errorf("import template %q: lower template %q has no rootfs: %w", name, lower.Name, errdefs.ErrInvalidArgument)
	}
	var chain []LayerRef
	if !empty {
		chain = lower.LayerChain()
	}
	for i, l := range layers {
		if err := ValidateDigest(l.Ref.Digest); err != nil {
			return Template{}, fmt.Errorf("import template %q: layer %d: %w", name, i, err)
		}
		if l.Open == nil {
			return Template{}, fmt.Errorf("import template %q: layer %s has no source: %w", name, l.Ref.Digest, errdefs.ErrInvalidArgument)
		}
		chain = append(chain, l.Ref)
	}
	if !sameChain(chain, p.Layers) {
		return Template{}, fmt.Errorf("import template %q: template %q plus %d layer(s) is not the published stack of %d layer(s): %w",
			name, lowerName(lower), len(layers), len(p.Layers), errdefs.ErrInvalidArgument)
	}
	if len(p.Layers) == 1 && p.Layers[0].Digest != p.Digest {
		// A flat template's one layer is its rootfs.
		return Template{}, fmt.Errorf("import template %q: its one layer %s is not its digest %s: %w",
			name, p.Layers[0].Digest, p.Digest, errdefs.ErrInvalidArgument)
	}
	return r.registerSpec(ctx, name, buildSpec{
		want: p.Digest,
		fill: func(ctx context.Context, rootfs string) (string, error) {
			source, rest := LayersSource+lower.Name, layers
			if empty {
				// The bottom layer is a flat rootfs, taken as it is (a
				// .wh. file there is a file, not a deletion).
				if err := fetchLayerInto(ctx, layers[0], rootfs); err != nil {
					return "", fmt.Errorf("template %q: layer %s: %w", name, layers[0].Ref.Digest, err)
				}
				source, rest = StreamSource, layers[1:]
			} else if err := LinkTree(ctx, lower.RootfsPath, rootfs); err != nil {
				return "", err
			}
			staging := filepath.Dir(rootfs)
			for i, l := range rest {
				dir := filepath.Join(staging, layerDir)
				if i < len(rest)-1 {
					dir = filepath.Join(staging, ".layer-"+strconv.Itoa(i))
				}
				if err := fetchLayer(ctx, l, dir); err != nil {
					return "", fmt.Errorf("template %q: layer %s: %w", name, l.Ref.Digest, err)
				}
				if err := putLayer(ctx, dir, rootfs); err != nil {
					return "", fmt.Errorf("template %q: apply layer %s: %w", name, l.Ref.Digest, err)
				}
				if i < len(rest)-1 {
					if err := removeTree(dir); err != nil { // its inodes live on in rootfs
						return "", err
					}
				}
			}
			if err := unshareUserDBs(rootfs); err != nil {
				return "", err
			}
			return source, nil
		},
		finish: func(ctx context.Context, rootfs string, t *Template) error {
			if err := checkXattrDigest(ctx, name, rootfs, p.XattrDigest); err != nil {
				return err
			}
			t.CPUCount, t.MemoryMB, t.DiskSizeMB = p.CPUCount, p.MemoryMB, p.DiskSizeMB
			t.Defaults = p.Defaults
			if len(p.Layers) > 1 {
				t.Layers = append([]LayerRef(nil), p.Layers...)
			}
			return nil
		},
	})
}

// lowerName names lower in errors; the zero Template is the empty rootfs.
func lowerName(lower Template) string {
	if lower.Name == "" {
		return "(empty)"
	}
	return lower.Name
}

// fetchLayer extracts the tar of l into the new directory dir with the
// ImportTar rules and checks its digest.
func fetchLayer(ctx context.Context, l LayerSource, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create layer dir: %w", err)
	}
	return fetchLayerInto(ctx, l, dir)
}

// fetchLayerInto extracts the tar of l into the existing empty directory
// dir with the ImportTar rules and checks its digest.
func fetchLayerInto(ctx context.Context, l LayerSource, dir string) error {
	rc, err := l.Open(ctx)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	err = extractTar(ctx, rc, dir)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	got, err := Digest(ctx, dir)
	if err != nil {
		return err
	}
	if got != l.Ref.Digest {
		return fmt.Errorf("content has digest %s, want %s (corrupt or tampered; nothing registered): %w", got, l.Ref.Digest, errdefs.ErrConflict)
	}
	return nil
}

// putLayer puts the layer directory layer on the tree rootfs (a LinkTree
// copy of the layers below, plus those applied so far): a whiteout .wh.NAME
// removes NAME; a directory is created when rootfs has none there and gets
// the layer's metadata; any other entry replaces what rootfs has at its
// path by a hard link to the layer's inode (rootfs's entry is unlinked,
// never written through: it is shared with another template). Whiteouts of
// a directory go before its other entries. Everything goes through
// directory fds without following symlinks.
func putLayer(ctx context.Context, layer, rootfs string) error {
	lfd, err := unix.Open(layer, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open layer %s: %w", layer, err)
	}
	defer unix.Close(lfd)
	rfd, err := unix.Open(rootfs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open rootfs %s: %w", rootfs, err)
	}
	defer unix.Close(rfd)
	if err := putLayerDir(ctx, lfd, rfd, ""); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(lfd, &st); err != nil {
		return err
	}
	xs, _, err := fdXattrs(lfd, "")
	if err != nil {
		return err
	}
	return setMetaFd(rfd, &st, xs)
}

func putLayerDir(ctx context.Context, lfd, rfd int, rel string) error {
	names, err := dirNames(lfd)
	if err != nil {
		return fmt.Errorf("read /%s: %w", rel, err)
	}
	var rest []string
	for _, n := range names {
		target, ok := strings.CutPrefix(n, whPrefix)
		if !ok {
			rest = append(rest, n)
			continue
		}
		if err := putWhiteout(lfd, rfd, n, target); err != nil {
			return fmt.Errorf("/%s: %w", path.Join(rel, n), err)
		}
	}
	for _, n := range rest {
		if err := ctx.Err(); err != nil {
			return err
		}
		r := path.Join(rel, n)
		if err := putLayerEntry(ctx, lfd, rfd, n, r); err != nil {
			return fmt.Errorf("/%s: %w", r, err)
		}
	}
	return nil
}

func putWhiteout(lfd, rfd int, n, target string) error {
	if n == whOpaque || target == "" || target == "." || target == ".." {
		return fmt.Errorf("not a whiteout Cube layers use (no opaque markers): %w", errdefs.ErrInvalidArgument)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(lfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("a whiteout must be a regular file: %w", errdefs.ErrInvalidArgument)
	}
	return removeAt(rfd, target)
}

func putLayerEntry(ctx context.Context, lfd, rfd int, n, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(lfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := removeAt(rfd, n); err != nil {
			return err
		}
		return unix.Linkat(lfd, n, rfd, n, 0)
	}
	var dst unix.Stat_t
	err := unix.Fstatat(rfd, n, &dst, unix.AT_SYMLINK_NOFOLLOW)
	if err != nil || dst.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := removeAt(rfd, n); err != nil {
			return err
		}
		if err := unix.Mkdirat(rfd, n, 0o700); err != nil {
			return err
		}
	}
	clfd, err := unix.Openat(lfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(clfd)
	crfd, err := unix.Openat(rfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(crfd)
	if err := putLayerDir(ctx, clfd, crfd, rel); err != nil {
		return err
	}
	xs, _, err := fdXattrs(lfd, n)
	if err != nil {
		return err
	}
	// Metadata last: times after the children, which bump them.
	return setMetaFd(crfd, &st, xs)
}

// checkXattrDigest checks that the XattrDigest of rootfs is want, unless
// want is "" (a server that publishes none).
func checkXattrDigest(ctx context.Context, name, rootfs, want string) error {
	if want == "" {
		return nil
	}
	got, err := XattrDigest(ctx, rootfs)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("template %q: imported xattrs have digest %q, want %s (tampered, or this node's filesystem does not keep an xattr namespace the server's does; nothing registered): %w",
			name, got, want, errdefs.ErrConflict)
	}
	return nil
}
