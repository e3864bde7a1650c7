package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// writeTopLayer stores the difference between parent's rootfs and rootfs
// (a LinkTree copy of it plus changes, prepared) as the layer directory
// <dir of rootfs>/layer and returns the new template's stack:
// parent.LayerChain() plus that layer.
func writeTopLayer(ctx context.Context, parent Template, rootfs string) ([]LayerRef, error) {
	if parent.RootfsPath == "" {
		return nil, fmt.Errorf("parent template %q has no rootfs path: %w", parent.Name, errdefs.ErrInvalidArgument)
	}
	if err := ValidateDigest(parent.Digest); err != nil {
		return nil, fmt.Errorf("parent template %q: %w", parent.Name, err)
	}
	dir := filepath.Join(filepath.Dir(rootfs), layerDir)
	size, err := makeLayer(ctx, parent.RootfsPath, rootfs, dir)
	if err != nil {
		return nil, fmt.Errorf("layer over template %q: %w", parent.Name, err)
	}
	// A parent replaced while we compared (its name re-registered) would
	// make the layer relative to another tree than the chain names. The
	// same digest means the same content, so then the layer is right.
	if err := sameParent(parent); err != nil {
		return nil, err
	}
	digest, err := Digest(ctx, dir)
	if err != nil {
		return nil, err
	}
	return append(parent.LayerChain(), LayerRef{Digest: digest, Size: size}), nil
}

// sameParent checks that parent's template.json still records its digest.
func sameParent(parent Template) error {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(parent.RootfsPath), metaFile))
	if err != nil {
		return fmt.Errorf("parent template %q: %w", parent.Name, err)
	}
	var now Template
	if err := json.Unmarshal(b, &now); err != nil {
		return fmt.Errorf("parent template %q: %w", parent.Name, err)
	}
	if now.Digest != parent.Digest {
		return fmt.Errorf("parent template %q was replaced while its child was made (digest %s, was %s): retry: %w",
			parent.Name, now.Digest, parent.Digest, errdefs.ErrConflict)
	}
	return nil
}

// makeLayer writes into the new directory layer the difference between the
// trees parent and rootfs, where rootfs was made as LinkTree(parent) plus
// changes, and returns the layer's size (bytes of its regular files, each
// inode once). In the layer:
//   - a non-directory of rootfs that is not the same inode (dev+ino) as the
//     parent's entry at that path is a hard link to rootfs's inode (no data
//     is copied, nothing is ever written through it);
//   - a directory appears when it is new, its type, mode, owner or xattrs
//     differ from the parent's, or something below it is in the layer; it
//     gets rootfs's metadata (times too). Times alone do not count: Digest
//     leaves them out, and so the layer applied to the parent reproduces
//     rootfs's Digest and XattrDigest, not its directory times;
//   - an entry of parent missing from rootfs is an empty file .wh.NAME
//     (mode 0, root) in its directory; a type change is just the new entry.
//
// The layer's root always has rootfs's root metadata. Nothing symlinked is
// followed: both trees are walked by directory fds.
func makeLayer(ctx context.Context, parent, rootfs, layer string) (int64, error) {
	pfd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open parent rootfs %s: %w", parent, err)
	}
	defer unix.Close(pfd)
	nfd, err := unix.Open(rootfs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open rootfs %s: %w", rootfs, err)
	}
	defer unix.Close(nfd)
	if err := os.Mkdir(layer, 0o700); err != nil {
		return 0, fmt.Errorf("create layer dir: %w", err)
	}
	lfd, err := unix.Open(layer, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open layer dir: %w", err)
	}
	defer unix.Close(lfd)
	d := &differ{ctx: ctx, seen: map[inode]bool{}}
	if _, err := d.dir(pfd, nfd, &lazyDir{fd: lfd}, ""); err != nil {
		return 0, fmt.Errorf("compare %s with %s: %w", rootfs, parent, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil {
		return 0, err
	}
	xs, _, err := fdXattrs(nfd, "")
	if err != nil {
		return 0, err
	}
	if err := setMetaFd(lfd, &st, xs); err != nil {
		return 0, fmt.Errorf("layer root: %w", err)
	}
	return d.size, nil
}

// lazyDir is a directory of the layer, made only when something goes into
// it: most directories of a parent hold no change, and making and removing
// each cost more than the whole comparison.
type lazyDir struct {
	parent *lazyDir // nil for the layer's root (fd open from the start)
	name   string
	fd     int // -1 until made
}

// open makes the directory (and its missing ancestors) and returns its fd.
func (l *lazyDir) open() (int, error) {
	if l.fd >= 0 {
		return l.fd, nil
	}
	pfd, err := l.parent.open()
	if err != nil {
		return -1, err
	}
	if err := unix.Mkdirat(pfd, l.name, 0o700); err != nil {
		return -1, fmt.Errorf("mkdir in layer: %w", err)
	}
	fd, err := unix.Openat(pfd, l.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	l.fd = fd
	return fd, nil
}

// close closes a directory open made (not the root's, which the caller
// owns).
func (l *lazyDir) close() {
	if l.parent != nil && l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

type differ struct {
	ctx  context.Context
	size int64
	seen map[inode]bool // regular files counted in size
}

// dir writes into the layer directory ld the difference between the
// rootfs directory nfd and the parent directory pfd (-1: the parent has no
// directory there, everything is new); rel is their path. It reports
// whether it wrote anything.
func (d *differ) dir(pfd, nfd int, ld *lazyDir, rel string) (bool, error) {
	names, err := dirNames(nfd)
	if err != nil {
		return false, fmt.Errorf("read /%s: %w", rel, err)
	}
	changed := false
	if pfd >= 0 {
		pnames, err := dirNames(pfd)
		if err != nil {
			return false, fmt.Errorf("read parent's /%s: %w", rel, err)
		}
		have := make(map[string]bool, len(names))
		for _, n := range names {
			have[n] = true
		}
		for _, n := range pnames {
			if have[n] {
				continue
			}
			lfd, err := ld.open()
			if err != nil {
				return false, err
			}
			if err := whiteout(lfd, n); err != nil {
				return false, fmt.Errorf("whiteout /%s: %w", path.Join(rel, n), err)
			}
			changed = true
		}
	}
	for _, n := range names {
		if err := d.ctx.Err(); err != nil {
			return false, err
		}
		r := path.Join(rel, n)
		wrote, err := d.entry(pfd, nfd, ld, n, r)
		if err != nil {
			return false, fmt.Errorf("/%s: %w", r, err)
		}
		changed = changed || wrote
	}
	return changed, nil
}

func (d *differ) entry(pfd, nfd int, ld *lazyDir, n, rel string) (bool, error) {
	if strings.HasPrefix(n, whPrefix) {
		return false, fmt.Errorf("a name starting with %q cannot be stored in a layer (it marks a deletion): rename it: %w", whPrefix, errdefs.ErrFailedPrecondition)
	}
	var nst, pst unix.Stat_t
	if err := unix.Fstatat(nfd, n, &nst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return false, err
	}
	inParent := false
	if pfd >= 0 {
		err := unix.Fstatat(pfd, n, &pst, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return false, err
		}
		inParent = err == nil
	}
	if nst.Mode&unix.S_IFMT == unix.S_IFDIR {
		parentDir := inParent && pst.Mode&unix.S_IFMT == unix.S_IFDIR
		return d.subdir(pfd, nfd, ld, n, rel, &nst, &pst, parentDir)
	}
	if inParent && pst.Dev == nst.Dev && pst.Ino == nst.Ino {
		return false, nil // the parent's own inode: unchanged
	}
	lfd, err := ld.open()
	if err != nil {
		return false, err
	}
	if err := unix.Linkat(nfd, n, lfd, n, 0); err != nil {
		return false, fmt.Errorf("link into layer: %w", err)
	}
	if key := (inode{uint64(nst.Dev), nst.Ino}); nst.Mode&unix.S_IFMT == unix.S_IFREG && !d.seen[key] {
		d.seen[key] = true
		d.size += nst.Size
	}
	return true, nil
}

// subdir handles the directory n of rootfs; parentDir says the parent has
// a directory there too (pst).
func (d *differ) subdir(pfd, nfd int, ld *lazyDir, n, rel string, nst, pst *unix.Stat_t, parentDir bool) (bool, error) {
	xs, _, err := fdXattrs(nfd, n)
	if err != nil {
		return false, err
	}
	same := false
	cpfd := -1
	if parentDir {
		pxs, _, err := fdXattrs(pfd, n)
		if err != nil {
			return false, fmt.Errorf("parent's: %w", err)
		}
		same = nst.Mode == pst.Mode && nst.Uid == pst.Uid && nst.Gid == pst.Gid && maps.Equal(xs, pxs)
		if cpfd, err = unix.Openat(pfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return false, fmt.Errorf("open parent's: %w", err)
		}
		defer unix.Close(cpfd)
	}
	cnfd, err := unix.Openat(nfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(cnfd)
	child := &lazyDir{parent: ld, name: n, fd: -1}
	defer child.close()
	wrote, err := d.dir(cpfd, cnfd, child, rel)
	if err != nil || (!wrote && same) {
		return false, err
	}
	clfd, err := child.open() // made already unless only its metadata changed
	if err != nil {
		return false, err
	}
	// Metadata last: times after the children, which bump them.
	return true, setMetaFd(clfd, nst, xs)
}

// whiteout creates the marker .wh.n (empty, mode 0, root) in dir.
func whiteout(dir int, n string) error {
	fd, err := unix.Openat(dir, whPrefix+n, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, 0, 0); err != nil {
		return err
	}
	return unix.Fchmod(fd, 0)
}
