package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/mountinfo"
)

// What EnsureShared did for a directory.
const (
	SharedAlready = "already shared" // it lies on a shared mount (a systemd host's /)
	SharedMade    = "made shared"    // it was its own mount point, now shared
	SharedBound   = "bound shared"   // bind-mounted onto itself, then made shared
)

// SharedMount is what EnsureShared found or did for one directory.
type SharedMount struct {
	Dir    string `json:"dir"`
	Mount  string `json:"mount"` // the mount point it lies on afterwards
	Action string `json:"action"`
}

// EnsureShared makes every dir (created if missing) lie on a mount with
// shared propagation, in the caller's mount namespace, which a volume with
// mountPropagation: Bidirectional needs: the kubelet refuses it on a host
// path under a private mount ("is mounted on / but it is not a shared
// mount"), as on hosts whose init is not systemd. A dir on a shared mount is
// left alone; a dir that is its own mount point is made shared; otherwise it
// is bind-mounted onto itself and made shared. Reruns change nothing (never
// a second bind on top), and concurrent runs are serialised by a lock on the
// directory. A dir that must be bound but has mounts below it is refused:
// the bind would hide them.
func EnsureShared(dirs []string) ([]SharedMount, error) {
	var out []SharedMount
	for _, d := range dirs {
		m, err := ensureShared(d)
		if err != nil {
			return out, err
		}
		out = append(out, m)
	}
	return out, nil
}

func ensureShared(dir string) (SharedMount, error) {
	if !filepath.IsAbs(dir) {
		return SharedMount{}, fmt.Errorf("shared mount %q: not an absolute path: %w", dir, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return SharedMount{}, fmt.Errorf("shared mount: %w", err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return SharedMount{}, fmt.Errorf("shared mount: %w", err)
	}
	// The cube-node and cube-node-bootstrap Pods of a node run this at the
	// same time; the lock is on the directory's inode, which a bind onto
	// itself keeps.
	fd, err := unix.Open(real, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return SharedMount{}, fmt.Errorf("shared mount: open %s: %w", real, err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return SharedMount{}, fmt.Errorf("shared mount: lock %s: %w", real, err)
	}
	defer unix.Flock(fd, unix.LOCK_UN)

	mounts, err := readMountInfo("/proc/self/mountinfo")
	if err != nil {
		return SharedMount{}, err
	}
	on := mountOf(mounts, real)
	res := SharedMount{Dir: dir, Mount: on.Point}
	switch {
	case on.Shared:
		res.Action = SharedAlready
		return res, nil
	case on.Point == real:
		if err := unix.Mount("", real, "", unix.MS_SHARED, ""); err != nil {
			return res, fmt.Errorf("shared mount: make %s shared: %w", real, err)
		}
		res.Action = SharedMade
		return res, nil
	}
	for _, m := range mounts {
		if strings.HasPrefix(m.Point, real+"/") {
			return res, fmt.Errorf("shared mount: %s lies on the private mount %s and has mounts below it (%s) that a bind would hide: make %s shared (mount --make-rshared %s) or unmount them, then retry: %w",
				real, on.Point, m.Point, on.Point, on.Point, errdefs.ErrFailedPrecondition)
		}
	}
	if err := unix.Mount(real, real, "", unix.MS_BIND, ""); err != nil {
		return res, fmt.Errorf("shared mount: bind %s onto itself: %w", real, err)
	}
	if err := unix.Mount("", real, "", unix.MS_SHARED, ""); err != nil {
		_ = unix.Unmount(real, unix.MNT_DETACH)
		return res, fmt.Errorf("shared mount: make %s shared: %w", real, err)
	}
	res.Mount, res.Action = real, SharedBound
	return res, nil
}

// ReleaseShared undoes EnsureShared's binds at uninstall: every dir that
// is a bind mount of itself (the same file system and directory as the
// mount below it, which is what EnsureShared makes) is unmounted. Dirs that
// are mounts of something else (a disk mounted there by the operator) and
// dirs that are not mount points are left alone. It returns the dirs
// unmounted.
func ReleaseShared(dirs []string) ([]string, error) {
	var released []string
	for _, d := range dirs {
		real, err := filepath.EvalSymlinks(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return released, fmt.Errorf("release shared mount: %w", err)
		}
		for { // EnsureShared binds once; a bind stacked by hand goes too
			mounts, err := readMountInfo("/proc/self/mountinfo")
			if err != nil {
				return released, err
			}
			if !isSelfBind(mounts, real) {
				break
			}
			if err := unix.Unmount(real, unix.MNT_DETACH); err != nil {
				return released, fmt.Errorf("release shared mount: unmount %s: %w", real, err)
			}
			released = append(released, d)
		}
	}
	return released, nil
}

// isSelfBind reports whether the topmost mount at path is a bind of path
// itself: the mount below it (at path or a parent) holds the same file
// system and, at path, the same directory.
func isSelfBind(mounts []MountInfo, path string) bool {
	top := -1
	for i, m := range mounts {
		if m.Point == path {
			top = i
		}
	}
	if top < 0 {
		return false
	}
	below := mountOf(slices.Delete(slices.Clone(mounts), top, top+1), path)
	if below.Point == "" || below.Dev != mounts[top].Dev {
		return false
	}
	rel := strings.TrimPrefix(path, strings.TrimSuffix(below.Point, "/"))
	return mounts[top].Root == filepath.Join(below.Root, rel)
}

// MountInfo is one line of /proc/<pid>/mountinfo.
type MountInfo struct {
	Point  string
	Shared bool   // has a shared:N peer group
	Dev    string // major:minor of the file system
	Root   string // the directory of the file system mounted here
}

func readMountInfo(file string) ([]MountInfo, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	return ParseMountInfo(string(b)), nil
}

// ParseMountInfo reads the mount points and their propagation from the
// text of /proc/<pid>/mountinfo, in order (a later mount on the same point
// is on top).
func ParseMountInfo(s string) []MountInfo {
	var out []MountInfo
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		m := MountInfo{Point: mountinfo.Unescape(f[4]), Dev: f[2], Root: mountinfo.Unescape(f[3])}
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			if strings.HasPrefix(opt, "shared:") {
				m.Shared = true
			}
		}
		out = append(out, m)
	}
	return out
}

// mountOf returns the mount path lies on: the longest mount point that is
// path or one of its parents, the topmost when several share it.
func mountOf(mounts []MountInfo, path string) MountInfo {
	var best MountInfo
	found := false
	for _, m := range mounts {
		if m.Point == path || m.Point == "/" || strings.HasPrefix(path, m.Point+"/") {
			if !found || len(m.Point) >= len(best.Point) {
				best, found = m, true
			}
		}
	}
	return best
}

// RunInMountNS runs exe with args in the mount namespace at nsPath and
// waits for it. A Go program cannot join a mount namespace itself (its
// threads share one file system context, and setns refuses that), so
// nsenter from util-linux joins it and then executes exe, which is passed
// open as fd 3 and named /proc/self/fd/3: its own path may not exist in
// that namespace (a binary of the container image, run in the host's).
func RunInMountNS(ctx context.Context, nsPath, exe string, args, env []string, stdout, stderr io.Writer) error {
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return fmt.Errorf("nsenter (util-linux) not found: %w", errdefs.ErrFailedPrecondition)
	}
	f, err := os.Open(exe)
	if err != nil {
		return fmt.Errorf("run in mount namespace: %w", err)
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, nsenter, append([]string{"--mount=" + nsPath, "--", "/proc/self/fd/3"}, args...)...)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env, cmd.Stdout, cmd.Stderr = env, stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("run %s in mount namespace %s: %w", filepath.Base(exe), nsPath, err)
	}
	return nil
}
