package nsrt

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// A sandbox with Spec.DiskSizeMB > 0 keeps its writable layer on its own
// ext4 filesystem: a sparse image file in the state dir, made before the
// init starts (by the agent's disk step, a DiskCache copy, else formatted
// by the shim) and mounted through a loop device, in the
// sandbox's mount namespace only. A disk filler then gets ENOSPC from its
// own filesystem and the host's stays untouched. The loop device is
// attached with autoclear, so the kernel detaches it when the mount
// namespace (the sandbox) ends: nothing is left to clean up on the host but
// the image file, which goes with the state dir. The shim mounts it
// (mountDiskDetached) and sandbox-init moves the mount into its namespace.
const (
	diskImage = "disk.img" // sparse ext4 image (in the state dir)
	diskMount = "disk"     // its mount point; holds upper/ and work/
)

// DiskImagePath is where a sandbox's disk image lives in its state dir; an
// image formatted there by MakeDisk can be passed as Spec.PreparedDisk.
func DiskImagePath(stateDir string) string { return filepath.Join(stateDir, diskImage) }

// loFlagsAutoclear detaches a loop device when its last user closes it.
const loFlagsAutoclear = 4

// mkfsTool formats the image; e2fsprogs is a dependency of sized disks.
const mkfsTool = "mkfs.ext4"

// placeDisk puts the sandbox's formatted disk image in its state dir: the
// prepared one when the spec names it (moved, no formatting), else a new one.
func placeDisk(stateDir string, spec Spec) error {
	if spec.PreparedDisk != "" {
		if err := os.Rename(spec.PreparedDisk, filepath.Join(stateDir, diskImage)); err == nil {
			return nil
		}
		// Gone or on another filesystem: format a fresh one instead.
	}
	return MakeDisk(filepath.Join(stateDir, diskImage), spec.DiskSizeMB)
}

// MakeDisk creates and formats a sandbox disk image of sizeMB at img,
// replacing any file there. The shim calls it at start; a warm pool may
// call it ahead of time and pass the image as Spec.PreparedDisk.
func MakeDisk(img string, sizeMB int) error { return makeDisk(img, sizeMB, "") }

// makeDisk is MakeDisk with more ext4 features (mkfs -O, comma separated).
func makeDisk(img string, sizeMB int, features string) error {
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	err = f.Truncate(int64(sizeMB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size disk image: %w", err)
	}
	// No journal (the layer dies with the sandbox), no reserved blocks (the
	// sandbox's root may fill it all), no discard pass over the sparse file.
	opts := "^has_journal"
	if features != "" {
		opts += "," + features
	}
	out, err := exec.Command(mkfsTool, "-q", "-F", "-m", "0", "-O", opts,
		"-E", "nodiscard,lazy_itable_init=1", img).CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("a disk size limit needs %s (e2fsprogs) on the node: %w", mkfsTool, errdefs.ErrUnavailable)
	}
	if err != nil {
		return fmt.Errorf("format disk image: %w: %s", err, out)
	}
	return nil
}

// mountDiskDetached attaches the state dir's image to a free loop device
// and mounts it as a detached mount (fsopen/fsmount): nothing appears in
// any mount namespace until sandbox-init moves it onto its disk/
// (attachDisk). The shim does this, outside the sandbox cgroup, whose
// device allowlist has no loop devices: opening the block device for the
// mount is what the allowlist checks, and the init now starts in that
// cgroup (no migration). If the init never takes it, closing the returned
// fd dissolves the mount and autoclear detaches the loop device.
func mountDiskDetached(stateDir string) (*os.File, error) {
	img, err := os.OpenFile(filepath.Join(stateDir, diskImage), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open disk image: %w", err)
	}
	defer img.Close()
	loop, err := attachLoop(img)
	if err != nil {
		return nil, err
	}
	// Closing our fd after the mount leaves the mount as the only user.
	defer loop.Close()
	fsfd, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("mount disk %s: fsopen: %w", loop.Name(), err)
	}
	defer unix.Close(fsfd)
	// nobarrier: no cache flush reaches the image file (a flush makes the
	// loop device fsync it). The layer only lives as long as the sandbox,
	// which no power loss survives, so neither the mount (it writes the
	// superblock) nor a workload's fsync waits for the host's disk: p90 of
	// mounting a fresh copy (DiskCache) 28-52 -> 11-12 ms under I/O load.
	if err := unix.FsconfigSetString(fsfd, "source", loop.Name()); err != nil {
		return nil, fmt.Errorf("mount disk %s: source: %w", loop.Name(), err)
	}
	if err := unix.FsconfigSetFlag(fsfd, "nobarrier"); err != nil {
		return nil, fmt.Errorf("mount disk %s: nobarrier: %w", loop.Name(), err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("mount disk %s: %w", loop.Name(), err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("mount disk %s: fsmount: %w", loop.Name(), err)
	}
	return os.NewFile(uintptr(mfd), "disk-mount"), nil
}

// attachDisk moves the detached disk mount (mountDiskDetached, received
// from the shim) onto the state dir's disk/ in the calling sandbox-init's
// mount namespace and returns that directory, which holds the overlay
// upper and work dirs.
func attachDisk(stateDir string, mnt *os.File) (string, error) {
	dir := filepath.Join(stateDir, diskMount)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := unix.MoveMount(int(mnt.Fd()), "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return "", fmt.Errorf("mount disk on %s: move_mount: %w", dir, err)
	}
	return dir, nil
}

// attachLoop binds img to a free loop device with autoclear set. Another
// process may take the device the kernel proposed; that is retried.
func attachLoop(img *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop control: %w: %w", errdefs.ErrUnavailable, err)
	}
	defer ctl.Close()
	for range 32 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := openLoop(n)
		if err != nil {
			return nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = loFlagsAutoclear
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, dev.Fd(), unix.LOOP_CONFIGURE, uintptr(unsafe.Pointer(&cfg)))
		if errno == 0 {
			return dev, nil
		}
		dev.Close()
		if errno != unix.EBUSY {
			return nil, fmt.Errorf("configure loop device %s: %w", dev.Name(), errno)
		}
	}
	return nil, fmt.Errorf("no free loop device after 32 attempts: %w", errdefs.ErrUnavailable)
}

// openLoop opens /dev/loopN, creating the node if devtmpfs lacks it (as in
// a container with a static /dev).
func openLoop(n int) (*os.File, error) {
	name := "/dev/loop" + strconv.Itoa(n)
	dev, err := os.OpenFile(name, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(name, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create %s: %w", name, err)
		}
		dev, err = os.OpenFile(name, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return dev, nil
}

// DiskUsage returns the bytes used and the size of the writable layer of
// the running sandbox whose init has host pid initPID, as the overlay
// reports them (the statfs of its upper filesystem). With a disk size limit
// these are the sandbox's own filesystem's numbers; without one, the host
// filesystem's, so callers wanting the layer's own usage then walk the
// state dir's upper/ instead.
func DiskUsage(initPID int) (used, size int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/proc/"+strconv.Itoa(initPID)+"/root/", &st); err != nil {
		return 0, 0, fmt.Errorf("statfs sandbox root: %w", err)
	}
	bs := int64(st.Bsize)
	return (int64(st.Blocks) - int64(st.Bfree)) * bs, int64(st.Blocks) * bs, nil
}
