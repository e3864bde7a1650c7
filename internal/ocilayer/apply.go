// Package ocilayer applies OCI (and Docker) image layers to a directory: each
// layer is a tar change set whose entries add or replace files and whose
// whiteouts (".wh.NAME") and opaque markers (".wh..wh..opq") delete what lower
// layers put there. Layers come from untrusted images, so nothing is ever
// written outside the target directory: entry names containing ".." are
// refused, parent directories are resolved with openat2(RESOLVE_IN_ROOT) (a
// symlink, absolute or relative, resolves as if the target were "/"), and the
// last path component is never followed.
package ocilayer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Whiteout naming of the OCI image spec (layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh." // AUFS metadata (.wh..wh.plnk, ...): never materialised
	opaqueMarker   = ".wh..wh..opq"
)

// Options tune Apply.
type Options struct {
	// IgnoreOwners keeps files owned by the caller instead of the uid/gid
	// the layer names, and tolerates xattrs the caller may not set (for
	// runs without root).
	IgnoreOwners bool
}

// Stats counts what Apply did with one layer.
type Stats struct {
	Entries   int // files, directories, links and FIFOs written
	Whiteouts int // whiteout and opaque markers applied
	Devices   int // device nodes skipped (the sandbox runtime provides /dev)
}

// Apply applies the layer tar rd (uncompressed) on top of the directory
// root, which holds the result of the lower layers. Entries are written with
// their mode (incl. setuid/setgid/sticky), numeric owner, modification time
// and xattrs (PAX SCHILYXATTR.*); hard links must point inside root; device
// nodes are skipped. A file replaces a directory of the same name and vice
// versa. Unsafe or malformed input fails with errdefs.ErrInvalidArgument; a
// failed Apply leaves root partly written (callers apply into a staging
// directory they discard).
func Apply(ctx context.Context, root string, rd io.Reader, opts Options) (Stats, error) {
	rootFD, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	a := &applier{root: rootFD, opts: opts, created: map[string]bool{}, ancestors: map[string]bool{}}
	tr := tar.NewReader(rd)
	for {
		if err := ctx.Err(); err != nil {
			return a.stats, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) {
				return a.stats, fmt.Errorf("read layer: corrupt tar: %v: %w", err, errdefs.ErrInvalidArgument)
			}
			return a.stats, fmt.Errorf("read layer: %w", err)
		}
		if err := a.entry(hdr, tr); err != nil {
			return a.stats, fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	return a.stats, a.finish()
}

type pendingDir struct {
	rel string
	hdr *tar.Header
}

type applier struct {
	root  int
	opts  Options
	stats Stats
	// created holds the paths this layer wrote (incl. directories made
	// implicitly as parents); ancestors their parent directories. Whiteouts
	// and opaque markers only hide what lower layers wrote.
	created   map[string]bool
	ancestors map[string]bool
	dirs      []pendingDir // metadata applied last, deepest first
}

func (a *applier) markCreated(rel string) {
	a.created[rel] = true
	for d := path.Dir(rel); d != "." && !a.ancestors[d]; d = path.Dir(d) {
		a.ancestors[d] = true
	}
}

// cleanName turns a tar path into a clean path relative to the root ("" is
// the root itself), refusing any ".." component.
func cleanName(name string) (string, error) {
	p := strings.TrimLeft(name, "/")
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q escapes the image root: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	if c := path.Clean(p); c != "." {
		return c, nil
	}
	return "", nil
}

func (a *applier) entry(hdr *tar.Header, body io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "" {
		if hdr.Typeflag == tar.TypeDir {
			a.dirs = append(a.dirs, pendingDir{"", hdr})
		}
		return nil
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if strings.HasPrefix(base, whiteoutPrefix) {
		return a.whiteout(dir, base)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeRegA, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	case tar.TypeChar, tar.TypeBlock:
		a.stats.Devices++
		return nil
	default: // sockets do not exist in tar; GNU/PAX meta entries are consumed by archive/tar
		return fmt.Errorf("unsupported tar entry type %q: %w", hdr.Typeflag, errdefs.ErrInvalidArgument)
	}
	pfd, err := a.parent(dir)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := a.clear(pfd, base, hdr.Typeflag == tar.TypeDir); err != nil {
		return err
	}
	a.stats.Entries++
	a.markCreated(rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir: %w", err)
		}
		a.dirs = append(a.dirs, pendingDir{rel, hdr})
		return nil
	case tar.TypeReg, tar.TypeRegA:
		if err := writeFile(pfd, base, body); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
	case tar.TypeLink:
		return a.hardlink(pfd, base, hdr.Linkname) // shares owner, mode and times with its target
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("mkfifo: %w", err)
		}
	}
	return a.meta(pfd, base, hdr)
}

// clear makes room for a new entry called base in pfd: a directory stays
// when the entry is a directory too (its contents merge); anything else is
// removed, a directory with all its contents.
func (a *applier) clear(pfd int, base string, isDir bool) error {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if isDir {
			return nil
		}
		return removeAt(pfd, base)
	}
	if err := unix.Unlinkat(pfd, base, 0); err != nil {
		return fmt.Errorf("replace: %w", err)
	}
	return nil
}

func writeFile(pfd int, base string, body io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	f := newFile(fd, base)
	_, err = io.Copy(f, body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("corrupt tar: file body cut short: %w", errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

func (a *applier) hardlink(pfd int, base, linkname string) error {
	target, err := cleanName(linkname)
	if err != nil || target == "" {
		return fmt.Errorf("hard link target %q is outside the image root: %w", linkname, errdefs.ErrInvalidArgument)
	}
	tdir, tbase := path.Split(target)
	tfd, err := a.openDir(strings.TrimSuffix(tdir, "/"))
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("hard link target %q does not exist: %w", linkname, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", linkname, err)
	}
	defer unix.Close(tfd)
	// flags 0: a symlink target is linked itself, never followed.
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EPERM) {
			return fmt.Errorf("hard link to %q: target missing or a directory: %v: %w", linkname, err, errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("hard link to %q: %w", linkname, err)
	}
	return nil
}

// whiteout applies ".wh.NAME" (remove dir/NAME from lower layers) or the
// opaque marker (hide all lower-layer contents of dir).
func (a *applier) whiteout(dir, base string) error {
	a.stats.Whiteouts++
	if base == opaqueMarker {
		fd, err := a.parent(dir) // the opaque directory itself, made if missing
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return a.pruneLower(fd, dir)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("bad whiteout %q: %w", base, errdefs.ErrInvalidArgument)
	}
	if a.created[path.Join(dir, name)] {
		return nil // a whiteout never hides its own layer's files
	}
	fd, err := a.openDir(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return removeAt(fd, name)
}

// pruneLower removes everything below the directory fd (at rel) that this
// layer did not write.
func (a *applier) pruneLower(fd int, rel string) error {
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(rel, n)
		if !a.created[p] && !a.ancestors[p] {
			if err := removeAt(fd, n); err != nil {
				return err
			}
			continue
		}
		cfd, err := unix.Openat(fd, n, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // a file this layer wrote
		}
		if err != nil {
			return fmt.Errorf("open %q: %w", p, err)
		}
		err = a.pruneLower(cfd, p)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}
