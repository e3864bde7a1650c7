// Package mountns starts processes in another mount namespace, normally the
// host's, from a cubelet that runs in a container of its own.
//
// A process's long-lived children inherit its mount namespace, and with it
// every mount in it: the container's root file system among them. A shim
// started from a container keeps that root file system mounted as long as
// its sandbox lives, long after the container is gone, and runs the
// container's copy of its binary. Started in the host's mount namespace,
// from a binary on a host path, it pins nothing of the container.
//
// setns(CLONE_NEWNS) is refused to a process whose threads share their
// file-system attributes (fs_struct), as every Go thread does; runc solves
// this with C code that runs before the Go runtime starts. Go can do it per
// thread instead: a locked OS thread that first unshares CLONE_FS has an
// fs_struct of its own and may join another mount namespace; a process it
// starts inherits that namespace, with root and working directory at its
// root. The thread is never unlocked, so the runtime discards it when its
// goroutine ends and no other goroutine ever runs in that namespace.
package mountns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/hostns"
)

// ID identifies a namespace (or a file): device and inode.
type ID struct{ Dev, Ino uint64 }

// IDOf stats path (following the /proc/<pid>/ns/* magic links).
func IDOf(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Self is the mount namespace of the calling thread.
func Self() (ID, error) { return IDOf("/proc/thread-self/ns/mnt") }

// FindHost looks for the host's mount namespace from inside a container
// (hostns.Find: pid 1's, else the nearest ancestor's that differs from this
// process's; with hostPID, the container runtime's shim). It returns ""
// when there is none to find: a cubelet started on the host, or in a
// container without hostPID, whose ancestors are invisible.
func FindHost() (string, error) {
	h, err := hostns.Find("/proc", os.Getpid(), "mnt")
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return h.Path, nil
}

// NS is an open mount namespace. The handle keeps the namespace reachable
// even after the process it was found through has exited.
type NS struct {
	fd   int
	path string
	id   ID
}

// Open opens the mount namespace file at path (e.g. /proc/<pid>/ns/mnt)
// and checks that this process may join it.
func Open(path string) (*NS, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open mount namespace %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat mount namespace %s: %w", path, err)
	}
	n := &NS{fd: fd, path: path, id: ID{Dev: st.Dev, Ino: st.Ino}}
	if err := n.Do(func() error { return nil }); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Path is where the namespace was opened from.
func (n *NS) Path() string { return n.path }

// ID identifies the namespace.
func (n *NS) ID() ID { return n.id }

// Close releases the handle.
func (n *NS) Close() error { return unix.Close(n.fd) }

// Do runs fn on an OS thread of its own that has joined the namespace: file
// paths fn uses resolve there, and processes it starts (exec.Cmd.Start) live
// there, with their root and working directory at its root. fn must not
// start goroutines that expect to run in the namespace. The thread is
// discarded afterwards; it may be one the process used before, so a child
// started earlier with Pdeathsig from an unlocked goroutine could get its
// signal (Go may discard threads anyway; such children belong on a thread
// locked for their whole life).
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread cannot be discarded (the runtime parks it
			// for good instead), and /proc/<pid>/{root,cwd,ns/mnt} follow
			// it: hold it here and let another thread do the work.
			errc <- n.Do(fn)
			runtime.UnlockOSThread()
			return
		}
		// Never unlocked from here on: the thread ends with this goroutine.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("unshare fs attributes: %w", err)
			return
		}
		if err := unix.Setns(n.fd, unix.CLONE_NEWNS); err != nil {
			if errors.Is(err, unix.EPERM) {
				err = fmt.Errorf("%w (joining another mount namespace needs CAP_SYS_ADMIN and CAP_SYS_CHROOT: a privileged container): %w", err, errdefs.ErrFailedPrecondition)
			}
			errc <- fmt.Errorf("join mount namespace %s: %w", n.path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Same reports, for each path, whether it names the same file here and in
// n (a hostPath volume mounted at the same path does). A path missing in n
// is not the same; one missing here is an error.
func (n *NS) Same(paths ...string) ([]bool, error) {
	here := make([]ID, len(paths))
	for i, p := range paths {
		id, err := IDOf(p)
		if err != nil {
			return nil, err
		}
		here[i] = id
	}
	same := make([]bool, len(paths))
	err := n.Do(func() error {
		for i, p := range paths {
			id, err := IDOf(p)
			same[i] = err == nil && id == here[i]
		}
		return nil
	})
	return same, err
}
