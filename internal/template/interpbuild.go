package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fillInterp fills rootfs with the code-interpreter template's files: from
// its cache when there is one, else base (itself cached) plus an apt
// install of InterpPackages inside it, then cached.
func (r *Registry) fillInterp(ctx context.Context, rootfs string, progress io.Writer) (string, error) {
	cacheDir := r.cacheDir()
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("create cache dir: %w", err)
	}
	cacheFile := filepath.Join(cacheDir, InterpCacheKey()+".tar")
	unlock, err := flock(ctx, cacheFile+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	source := fmt.Sprintf("base + apt-get install %s", strings.Join(InterpPackages, " "))
	if cached, err := fillFromCache(ctx, cacheFile, rootfs, "template "+InterpName, progress); err != nil || cached {
		return source + " (cached)", err
	}
	start := time.Now()
	baseSource, err := r.fillBase(ctx, DefaultBaseSpec(), rootfs, progress)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "cube: template %s: apt-get install %s\n", InterpName, strings.Join(InterpPackages, " "))
	if err := aptInstall(ctx, rootfs, progress, interpPreinstall, InterpPackages); err != nil {
		return "", err
	}
	if err := cleanAptCaches(rootfs); err != nil {
		return "", fmt.Errorf("clean apt caches: %w", err)
	}
	if err := removeSpecialFiles(ctx, rootfs); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "cube: template %s: installed in %s; caching in %s\n", InterpName, time.Since(start).Round(time.Second), cacheFile)
	if err := writeTarCache(ctx, rootfs, cacheFile); err != nil {
		fmt.Fprintf(progress, "cube: could not cache template %s: %v\n", InterpName, err)
	}
	return source + " on " + baseSource, nil
}

// aptInstall runs apt-get update and then one apt-get install per package
// group in a chroot of rootfs (its sources: the mirror debootstrap used).
// For the time of the install it gives rootfs the host's resolv.conf and
// the device nodes apt needs; both are put back (nodes removed) after.
func aptInstall(ctx context.Context, rootfs string, progress io.Writer, groups ...[]string) (err error) {
	undo, err := chrootSetup(rootfs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, undo()) }()
	steps := [][]string{{"apt-get", "update", "-q"}}
	for _, g := range groups {
		steps = append(steps, append([]string{"apt-get", "install", "-y", "-q", "--no-install-recommends"}, g...))
	}
	for _, argv := range steps {
		if err := chrootRun(ctx, rootfs, progress, argv); err != nil {
			return err
		}
	}
	return nil
}

// chrootDevices are the nodes apt, apt-key and dpkg scripts open.
var chrootDevices = []struct {
	name  string
	minor uint32
}{{"null", 3}, {"zero", 5}, {"random", 8}, {"urandom", 9}}

func chrootSetup(rootfs string) (undo func() error, err error) {
	resolv := filepath.Join(rootfs, "etc/resolv.conf")
	old, oldErr := os.ReadFile(resolv)
	host, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil, fmt.Errorf("host resolv.conf: %w", err)
	}
	// A symlink (systemd-resolved style) is replaced, not followed.
	_ = os.Remove(resolv)
	if err := os.WriteFile(resolv, host, 0o644); err != nil {
		return nil, fmt.Errorf("chroot resolv.conf: %w", err)
	}
	dev := filepath.Join(rootfs, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return nil, err
	}
	for _, d := range chrootDevices {
		p := filepath.Join(dev, d.name)
		_ = os.Remove(p)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, d.minor))); err != nil {
			return nil, fmt.Errorf("chroot /dev/%s: %w", d.name, err)
		}
		_ = os.Chmod(p, 0o666) // mknod's mode is masked by the umask
	}
	return func() error {
		var errs []error
		for _, d := range chrootDevices {
			if err := os.Remove(filepath.Join(dev, d.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if oldErr == nil {
			errs = append(errs, os.WriteFile(resolv, old, 0o644))
		}
		return errors.Join(errs...)
	}, nil
}

// chrootRun runs argv in rootfs with a clean environment, streaming its
// output to progress; the error carries the last lines.
func chrootRun(ctx context.Context, rootfs string, progress io.Writer, argv []string) error {
	cmd := exec.CommandContext(ctx, "/usr/bin/"+argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C", "HOME=/root"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	tail, err := runStreaming(cmd, progress, 15)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", strings.Join(argv, " "), ctx.Err())
		}
		return fmt.Errorf("%s in the template rootfs failed (needs the Debian mirror): %w\n%s", strings.Join(argv, " "), err, strings.Join(tail, "\n"))
	}
	return nil
}
