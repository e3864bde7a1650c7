package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Meta is what a caller of Register says about the template it registers.
type Meta struct {
	// CPUCount, MemoryMB and DiskSizeMB are the template's sizes; 0 means
	// the registry's defaults.
	CPUCount, MemoryMB, DiskSizeMB int
	// Source describes where the template came from (template.json).
	Source string
	// Defaults of the template's sandboxes; nil for none.
	Defaults *Defaults
	// Parent, when set, is the template the new rootfs was made from (by
	// LinkTree plus changes): Register then stores the difference as
	// <name>/layer and sets Layers = Parent.LayerChain() + that layer.
	Parent *Template
}

// Register registers template name from fill, which populates the empty
// directory rootfs, with the metadata meta. As every registration it is
// atomic (a crash leaves the previous state) and the digest is computed
// over the prepared rootfs as for any other template. A template of that
// name is replaced: the caller makes sure no sandbox still uses its rootfs
// as a lower layer.
func (r *Registry) Register(ctx context.Context, name string, meta Meta, fill func(ctx context.Context, rootfs string) error) (Template, error) {
	return r.registerSpec(ctx, name, buildSpec{
		replace: true,
		fill: func(ctx context.Context, rootfs string) (string, error) {
			if err := fill(ctx, rootfs); err != nil {
				return "", err
			}
			if err := unshareUserDBs(rootfs); err != nil {
				return "", err
			}
			return meta.Source, nil
		},
		finish: func(ctx context.Context, rootfs string, t *Template) error {
			t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.Defaults = meta.CPUCount, meta.MemoryMB, meta.DiskSizeMB, meta.Defaults
			if meta.Parent == nil {
				return nil
			}
			// In the staging dir, after prepare: the layer is part of the
			// atomic registration and holds what prepare changed too.
			layers, err := writeTopLayer(ctx, *meta.Parent, rootfs)
			if err != nil {
				return err
			}
			t.Layers = layers
			return nil
		},
	})
}

// unshareUserDBs gives rootfs its own copy of the user databases, which
// PrepareRootfs edits in place: never through a hard link into another
// template (a LinkTree copy, or a layer's inode).
func unshareUserDBs(rootfs string) error {
	for _, f := range []string{"etc/passwd", "etc/group", "etc/shadow", "etc/gshadow"} {
		if err := unshare(rootfs, f); err != nil {
			return fmt.Errorf("prepare /%s: %w", f, err)
		}
	}
	return nil
}

// swapIn moves the complete staging directory to final. When a template is
// there already (replaced), the two are exchanged in one step, so readers
// see the old template or the new one and never none; the old one, now at
// the staging path, is then removed (a crash leaves it to cleanStale).
func (r *Registry) swapIn(staging, final string, exists bool) error {
	if !exists {
		return os.Rename(staging, final)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, staging, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE); err != nil {
		return fmt.Errorf("exchange %s with %s: %w", staging, final, err)
	}
	_ = removeTree(staging) // the new template is in place whatever happens here
	return nil
}

// unshare replaces rootfs/name, when it is a regular file with other hard
// links, by a copy of its own (same owner, mode, xattrs and times). Every
// path goes through an os.Root: a symlinked /etc never leads out.
func unshare(rootfs, name string) (err error) {
	dir, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer dir.Close()
	fi, err := dir.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || !fi.Mode().IsRegular() || st.Nlink < 2 {
		return nil
	}
	in, err := dir.OpenFile(name, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	var ist unix.Stat_t
	if err := unix.Fstat(int(in.Fd()), &ist); err != nil || ist.Ino != st.Ino {
		return fmt.Errorf("/%s changed while copied: %v", name, err)
	}
	xs, _, err := fdXattrs(int(in.Fd()), "")
	if err != nil {
		return err
	}
	tmp := name + ".unshare-" + randSuffix()
	out, err := dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = dir.Remove(tmp)
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if err := setMetaFd(int(out.Fd()), &ist, xs); err != nil {
		return err
	}
	return dir.Rename(tmp, name)
}
