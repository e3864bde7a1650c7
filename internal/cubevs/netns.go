package cubevs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// isPinned reports whether path is a mounted network namespace file.
func isPinned(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Type == unix.NSFS_MAGIC, nil
}

// ensurePinnedNetNS returns a handle on the network namespace pinned at
// path, creating and pinning a new one when path is absent or a leftover
// plain file (a crash between create and mount).
func ensurePinnedNetNS(path string) (netns.NsHandle, error) {
	ok, err := isPinned(path)
	if err != nil {
		return netns.None(), err
	}
	if !ok {
		if err := pinNewNetNS(path); err != nil {
			return netns.None(), err
		}
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return netns.None(), fmt.Errorf("open netns %s: %w", path, err)
	}
	return h, nil
}

// pinNewNetNS creates a network namespace on a dedicated OS thread and
// bind-mounts it onto path. The thread returns to its original namespace;
// if it cannot, it stays locked so the Go runtime discards it.
func pinNewNetNS(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("pin netns: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return fmt.Errorf("pin netns: %w", err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("pin netns %s: current netns: %w", path, err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("pin netns %s: unshare: %w", path, err)
			return
		}
		merr := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if merr != nil {
			merr = fmt.Errorf("pin netns %s: bind mount: %w", path, merr)
		}
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it exits with this goroutine.
			errc <- errors.Join(merr, fmt.Errorf("pin netns %s: restore thread netns: %w", path, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- merr
	}()
	return <-errc
}

// unpinNetNS unmounts and removes a pin file; missing pieces are fine.
func unpinNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil &&
		!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns pin: %w", err)
	}
	return nil
}

// InNetNS runs fn on an OS thread switched into ns and switches back; a
// thread that cannot switch back is discarded. Use it only for what must be
// done from inside a namespace (per-netns /proc files, sysctls).
func InNetNS(ns netns.NsHandle, fn func() error) error { return inNetNS(ns, fn) }

func inNetNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("restore thread netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// writeSysctls sets /proc/sys entries (paths relative to /proc/sys) inside ns.
func writeSysctls(ns netns.NsHandle, kv map[string]string) error {
	return inNetNS(ns, func() error {
		var errs []error
		for k, v := range kv {
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("sysctl %s=%s: %w", k, v, err))
			}
		}
		return errors.Join(errs...)
	})
}
