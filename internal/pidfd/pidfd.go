package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// pidFD is a pidfd: a stable handle on a process that need not be our child,
// readable once the process has exited.
type pidFD struct {
	pid int
	f   *os.File
}

// openPidFD opens a pidfd for pid; ErrNotFound when there is no such process.
func openPidFD(pid int) (*pidFD, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, syscall.ESRCH) {
		return nil, fmt.Errorf("process %d: %w", pid, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// A non-blocking fd is registered with the runtime poller, so waiting
	// honours deadlines without a thread per wait.
	return &pidFD{pid: pid, f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))}, nil
}

// exited reports whether the process has terminated, without blocking.
func (p *pidFD) exited() bool {
	var done bool
	rc, err := p.f.SyscallConn()
	if err != nil {
		return true
	}
	_ = rc.Control(func(fd uintptr) { done = pidfdReadable(int(fd)) })
	return done
}

func pidfdReadable(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return err != nil || (n > 0 && fds[0].Revents != 0)
	}
}

// exitedWithin reports whether the process exits within d (bounded by
// ctx as well); it returns at once if it already has.
func (p *pidFD) exitedWithin(ctx context.Context, d time.Duration) bool {
	if p.exited() {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return p.wait(ctx) == nil
}

// wait blocks until the process has exited or ctx ends.
func (p *pidFD) wait(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { _ = p.f.SetReadDeadline(time.Now()) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		_ = p.f.SetReadDeadline(d)
	}
	defer p.f.SetReadDeadline(time.Time{})
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	err = rc.Read(func(fd uintptr) bool { return pidfdReadable(int(fd)) })
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for process %d: %w: %w", p.pid, errdefs.ErrUnavailable, ctx.Err())
		}
		return fmt.Errorf("waiting for process %d: %w", p.pid, err)
	}
	return nil
}

// kill sends SIGKILL through the pidfd (never to a recycled pid).
func (p *pidFD) kill() error {
	var serr error
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) { serr = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0) }); err != nil {
		return err
	}
	if errors.Is(serr, syscall.ESRCH) {
		return nil
	}
	return serr
}

func (p *pidFD) close() error { return p.f.Close() }
