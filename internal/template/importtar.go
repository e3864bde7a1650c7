package template

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ImportTar registers a template called name from a rootfs tarball (.tar or
// .tar.gz; compression is detected from the content). Entries whose path
// escapes the root (after stripping a leading "/" or "./") make the import
// fail with errdefs.ErrInvalidArgument. Symlinks are created but never
// followed while extracting, hard links must point inside the archive,
// xattrs (PAX SCHILYXATTR records) are set, except security.selinux and
// namespaces the filesystem refuses, and device nodes are skipped.
func (r *Registry) ImportTar(ctx context.Context, name, file string) (Template, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return Template{}, fmt.Errorf("import tar %s: %w", file, err)
	}
	if _, err := os.Stat(abs); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Template{}, fmt.Errorf("import tar %s: %w", file, errdefs.ErrNotFound)
		}
		return Template{}, fmt.Errorf("import tar %s: %w", file, err)
	}
	return r.register(ctx, name, func(ctx context.Context, rootfs string) (string, error) {
		if err := extractTarFile(ctx, abs, rootfs); err != nil {
			return "", err
		}
		return "tar:" + abs, nil
	})
}

// extractTarFile extracts a .tar or .tar.gz file into the directory root.
func extractTarFile(ctx context.Context, file, root string) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("open %s: %w", file, err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 1<<20)
	var rd io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("read %s: %w", file, err)
		}
		defer zr.Close()
		rd = zr
	}
	if err := extractTar(ctx, rd, root); err != nil {
		return fmt.Errorf("extract %s: %w", file, err)
	}
	return nil
}

// extractTar extracts a tar stream into the existing directory root.
func extractTar(ctx context.Context, rd io.Reader, root string) error {
	rootFD, err := unix.Open(root, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(rootFD)
	x := &extractor{root: rootFD}
	tr := tar.NewReader(rd)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	return x.finish()
}

// cleanEntry turns a tar path into a clean path relative to the root, or
// fails when it escapes. "" means the root itself.
func cleanEntry(name string) (string, error) {
	p := strings.TrimLeft(name, "/")
	if p == "" || p == "." || p == "./" {
		return "", nil
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q escapes the root: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	c := path.Clean(p)
	if c == "." {
		return "", nil
	}
	return c, nil
}

type pendingDir struct {
	rel string
	hdr *tar.Header
}

type extractor struct {
	root int
	dirs []pendingDir
}

// parent opens the parent directory of rel beneath the root without
// following any symlink, creating missing directories (mode 0755).
func (x *extractor) parent(rel string) (int, string, error) {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		fd, err := unix.Dup(x.root)
		return fd, base, err
	}
	fd, err := x.openDir(dir)
	if errors.Is(err, unix.ENOENT) {
		if err := x.mkdirAll(dir); err != nil {
			return -1, "", err
		}
		fd, err = x.openDir(dir)
	}
	if err != nil {
		return -1, "", fmt.Errorf("open parent %q: %w", dir, err)
	}
	return fd, base, nil
}

func (x *extractor) openDir(rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(x.root, rel, &how)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%q is a symlink or not a directory (symlinks are not followed while extracting): %w", rel, errdefs.ErrInvalidArgument)
		}
		return fd, err
	}
}

func (x *extractor) mkdirAll(rel string) error {
	cur := ""
	for _, part := range strings.Split(rel, "/") {
		cur = path.Join(cur, part)
		fd, base, err := x.parent(cur)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(fd, base, 0o755)
		unix.Close(fd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir %q: %w", cur, err)
		}
	}
	return nil
}

func (x *extractor) entry(hdr *tar.Header, body io.Reader) error {
	rel, err := cleanEntry(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "" {
		if hdr.Typeflag == tar.TypeDir {
			x.dirs = append(x.dirs, pendingDir{"", hdr})
		}
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default: // devices, pax/gnu meta handled by archive/tar, anything else
		return nil
	}
	pfd, base, err := x.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)

	if hdr.Typeflag == tar.TypeDir {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return fmt.Errorf("exists and is not a directory: %w", errdefs.ErrInvalidArgument)
		}
		x.dirs = append(x.dirs, pendingDir{rel, hdr})
		return nil
	}
	// Later entries replace earlier non-directories of the same name.
	if err := unix.Unlinkat(pfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		if errors.Is(err, unix.EISDIR) {
			return fmt.Errorf("would replace a directory: %w", errdefs.ErrInvalidArgument)
		}
		return fmt.Errorf("replace: %w", err)
	}
	switch hdr.Typeflag {
	case tar.TypeReg:
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		f := os.NewFile(uintptr(fd), rel)
		_, err = io.Copy(f, body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
	case tar.TypeLink:
		target, err := cleanEntry(hdr.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("hard link target %q is outside the archive: %w", hdr.Linkname, errdefs.ErrInvalidArgument)
		}
		ofd, obase, err := x.parent(target)
		if err != nil {
			return err
		}
		err = unix.Linkat(ofd, obase, pfd, base, 0)
		unix.Close(ofd)
		if err != nil {
			return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
		}
		return nil // the link shares owner, mode and times with its target
	case tar.TypeFifo:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("mkfifo: %w", err)
		}
	}
	return applyMeta(pfd, base, hdr)
}

// applyMeta sets owner, mode and times on pfd/base without following symlinks.
func applyMeta(pfd int, base string, hdr *tar.Header) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// fchmodat without AT_SYMLINK_NOFOLLOW is safe: base is known not to be a symlink.
		if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode)&0o7777, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	// After chown (which drops security.capability) and after the content
	// is written (a write drops it too).
	if err := setXattrs(pfd, base, hdr); err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		at := hdr.AccessTime
		if at.IsZero() {
			at = hdr.ModTime
		}
		ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("set times: %w", err)
		}
	}
	return nil
}

// finish applies directory metadata, deepest last-created first, so that
// restrictive modes and times are set after the children exist.
func (x *extractor) finish() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if d.rel == "" {
			if err := unix.Fchown(x.root, d.hdr.Uid, d.hdr.Gid); err != nil {
				return fmt.Errorf("chown root: %w", err)
			}
			if err := unix.Fchmod(x.root, uint32(d.hdr.Mode)&0o7777); err != nil {
				return fmt.Errorf("chmod root: %w", err)
			}
			if err := setXattrs(x.root, "", d.hdr); err != nil {
				return fmt.Errorf("root: %w", err)
			}
			if err := setRootTimes(x.root, d.hdr); err != nil {
				return err
			}
			continue
		}
		pfd, base, err := x.parent(d.rel)
		if err != nil {
			return fmt.Errorf("%s: %w", d.rel, err)
		}
		err = applyMeta(pfd, base, d.hdr)
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("%s: %w", d.rel, err)
		}
	}
	return nil
}

// setRootTimes sets the times of the root directory (open as fd) through
// its /proc/self/fd link: utimensat has no flag for "fd itself" in Go.
func setRootTimes(fd int, hdr *tar.Header) error {
	if hdr.ModTime.IsZero() {
		return nil
	}
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), ts, 0); err != nil {
		return fmt.Errorf("set times of root: %w", err)
	}
	return nil
}
