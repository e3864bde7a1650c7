package nsrt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// makeMountsPrivate stops mount events propagating between the sandbox's
// mount namespace and the host's.
func makeMountsPrivate() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	return nil
}

// prepareLayer returns the directory that holds the writable layer: the
// sandbox's own disk, whose mount the shim hands over (disk, attached
// here), when it has a size limit, else the state dir.
func prepareLayer(spec Spec, disk *os.File) (string, error) {
	if spec.DiskSizeMB > 0 {
		if disk == nil {
			return "", errors.New("the shim sent no disk mount")
		}
		return attachDisk(spec.StateDir, disk)
	}
	return spec.StateDir, nil
}

// setupRoot builds the sandbox's root filesystem and pivots into it. Only
// the overlay is mounted through host paths; everything else happens after
// pivot_root, so symlinks in the template resolve inside the sandbox and
// can never reach host files. Files and binds come before /proc and /sys so
// that a template symlink into /proc cannot redirect them either.
//
// With a user namespace (child != nil) the overlay's layers are idmapped
// through the workload's namespace and everything from the overlay mount
// on is created with the mapped root's fsuid (see userns.go).
func setupRoot(spec Spec, layer string, child *usernsChild) error {
	root := filepath.Join(spec.StateDir, rootfsDir)
	for _, d := range []string{root, filepath.Join(layer, upperDir), filepath.Join(layer, workDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	lower := spec.Rootfs
	if child != nil {
		var err error
		if lower, layer, err = child.idmapLayers(spec.StateDir, spec.Rootfs, layer); err != nil {
			return err
		}
		restore, err := asMappedRoot(child.u, child.u.HostID)
		if err != nil {
			return err
		}
		defer restore()
	}
	upper := filepath.Join(layer, upperDir)
	work := filepath.Join(layer, workDir)
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	// nodev: a device node in a template (or made by anyone) opens nothing;
	// the sandbox's devices are the bind mounts on its /dev.
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay (%s): %w", opts, err)
	}
	oldRoot, err := os.MkdirTemp(root, ".oldroot-")
	if err != nil {
		return err
	}
	if child != nil {
		if err := child.waitStarted(); err != nil {
			return err
		}
	}
	if err := unix.PivotRoot(root, oldRoot); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	oldRoot = "/" + filepath.Base(oldRoot)

	if err := writeFiles(spec.Files); err != nil {
		return err
	}
	for _, b := range spec.Binds {
		if err := bindMount(filepath.Join(oldRoot, b.Source), b.Target, b.ReadOnly); err != nil {
			return fmt.Errorf("bind %s -> %s: %w", b.Source, b.Target, err)
		}
	}
	if err := mountSystem(oldRoot); err != nil {
		return err
	}
	if err := protectKernelFiles(child != nil); err != nil {
		return err
	}
	if err := unix.Unmount(oldRoot, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount old root: %w", err)
	}
	return os.Remove(oldRoot)
}

func writeFiles(files map[string]FileSpec) error {
	for p, f := range files {
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = 0o644
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		// Replace whatever the template has there, symlinks included.
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := os.WriteFile(p, f.Data, mode); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := os.Chmod(p, mode); err != nil { // not subject to umask
			return err
		}
	}
	return nil
}

// bindMount bind-mounts src onto dst, creating dst (a file or a directory
// like src) if it is missing.
func bindMount(src, dst string, readOnly bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.IsDir() {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
	} else if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
		if err := os.WriteFile(dst, nil, 0o644); err != nil {
			return err
		}
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if readOnly {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount read-only: %w", err)
		}
	}
	return nil
}

// devices are bind-mounted from the host's /dev into the sandbox's tmpfs /dev.
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// mountSystem mounts /proc, /sys, /dev and friends inside the new root.
func mountSystem(oldRoot string) error {
	type mnt struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}
	const common = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	mounts := []mnt{
		{"proc", "/proc", "proc", common, ""},
		{"sysfs", "/sys", "sysfs", common | unix.MS_RDONLY, ""},
		// nodev too: its devices are bind mounts, which keep their own flags.
		{"tmpfs", "/dev", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_STRICTATIME, "mode=755,size=65536k"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"},
		{"shm", "/dev/shm", "tmpfs", common, "mode=1777,size=65536k"},
		{"mqueue", "/dev/mqueue", "mqueue", common, ""},
	}
	for _, m := range mounts {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", m.dst, err)
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	for _, d := range devices {
		if err := bindMount(filepath.Join(oldRoot, "dev", d), filepath.Join("/dev", d), false); err != nil {
			return fmt.Errorf("device %s: %w", d, err)
		}
	}
	links := [][2]string{
		{"pts/ptmx", "/dev/ptmx"}, {"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"},
		{"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"},
	}
	for _, l := range links {
		if err := os.Symlink(l[0], l[1]); err != nil {
			return fmt.Errorf("symlink %s: %w", l[1], err)
		}
	}
	return nil
}
