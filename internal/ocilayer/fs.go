package ocilayer

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// openDir opens the directory rel below the root. Symlinks on the way are
// resolved inside the root (RESOLVE_IN_ROOT: "/" and ".." stop at the root),
// as a container runtime would see them, so no path leads outside.
func (a *applier) openDir(rel string) (int, error) {
	if rel == "" {
		return unix.Dup(a.root)
	}
	how := unix.OpenHow{
		Flags:   unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for {
		fd, err := unix.Openat2(a.root, rel, &how)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.ENOTDIR):
			return -1, fmt.Errorf("%q is not a directory: %w", rel, errdefs.ErrInvalidArgument)
		case errors.Is(err, unix.ELOOP):
			return -1, fmt.Errorf("%q: too many levels of symlinks: %w", rel, errdefs.ErrInvalidArgument)
		}
		return fd, err
	}
}

// parent opens the directory rel, creating it and its missing parents
// (mode 0755, recorded as written by this layer).
func (a *applier) parent(rel string) (int, error) {
	fd, err := a.openDir(rel)
	if !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return -1, fmt.Errorf("open parent %q: %w", rel, err)
		}
		return fd, nil
	}
	dir, base := path.Split(rel)
	pfd, err := a.parent(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("mkdir %q: %w", rel, err)
	}
	a.markCreated(rel)
	fd, err = unix.Openat(pfd, base, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		// A symlink whose target is missing: creating directories through
		// it is refused rather than guessed.
		return -1, fmt.Errorf("parent %q is a dangling symlink or not a directory: %w", rel, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return -1, fmt.Errorf("open parent %q: %w", rel, err)
	}
	return fd, nil
}

// removeAt removes name in the directory dfd, recursively, never following
// a symlink.
func removeAt(dfd int, name string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("remove %q: %w", name, err)
	}
	fd, err := unix.Openat(dfd, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("remove %q: %w", name, err)
	}
	names, err := readNames(fd)
	for _, n := range names {
		if err == nil {
			err = removeAt(fd, n)
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("remove %q: %w", name, err)
	}
	return nil
}

// readNames lists the directory fd (left open, position consumed).
func readNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := newFile(dup, "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("read dir: %w", err)
	}
	sort.Strings(names)
	return names, nil
}

func newFile(fd int, name string) *os.File { return os.NewFile(uintptr(fd), name) }

// meta sets owner, mode, xattrs and times of pfd/base, never following a
// symlink. The owner goes first: chown clears setuid/setgid bits.
func (a *applier) meta(pfd int, base string, hdr *tar.Header) error {
	if !a.opts.IgnoreOwners {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// Without AT_SYMLINK_NOFOLLOW (unsupported by fchmodat): base is
		// known not to be a symlink, the applier being its only writer.
		if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode)&0o7777, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := a.xattrs(pfd, base, hdr); err != nil {
		return err
	}
	if hdr.ModTime.IsZero() {
		return nil
	}
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// xattrs sets the PAX SCHILYXATTR.* records. The path goes through the
// parent's /proc/self/fd link (already resolved inside the root) and
// lsetxattr does not follow the last component.
func (a *applier) xattrs(pfd int, base string, hdr *tar.Header) error {
	var keys []string
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "SCHILYXATTR.") {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	sort.Strings(keys)
	p := "/proc/self/fd/" + strconv.Itoa(pfd) + "/" + base
	for _, k := range keys {
		name := strings.TrimPrefix(k, "SCHILYXATTR.")
		err := unix.Lsetxattr(p, name, []byte(hdr.PAXRecords[k]), 0)
		switch {
		case err == nil:
		case errors.Is(err, unix.ENOTSUP):
			// The filesystem (or LSM) does not take this namespace, e.g.
			// security.selinux without SELinux: containerd skips it too.
		case errors.Is(err, unix.EPERM) && a.opts.IgnoreOwners:
		default:
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	return nil
}

// finish applies directory metadata, deepest and last-written first, so
// restrictive modes and times are set after the children exist.
func (a *applier) finish() error {
	for i := len(a.dirs) - 1; i >= 0; i-- {
		d := a.dirs[i]
		if d.rel == "" {
			if err := a.rootMeta(d.hdr); err != nil {
				return err
			}
			continue
		}
		dir, base := path.Split(d.rel)
		pfd, err := a.openDir(strings.TrimSuffix(dir, "/"))
		if err != nil {
			return fmt.Errorf("%s: %w", d.rel, err)
		}
		var st unix.Stat_t
		err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = a.meta(pfd, base, d.hdr)
		} else if errors.Is(err, unix.ENOENT) || err == nil {
			err = nil // replaced or removed by a later entry of the layer
		}
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("%s: %w", d.rel, err)
		}
	}
	return nil
}

func (a *applier) rootMeta(hdr *tar.Header) error {
	if !a.opts.IgnoreOwners {
		if err := unix.Fchown(a.root, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown root: %w", err)
		}
	}
	if err := unix.Fchmod(a.root, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("chmod root: %w", err)
	}
	return nil
}
