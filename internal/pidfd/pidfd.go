// Package pidfd is a handle on a process by pidfd: it never names a
// recycled pid, and waiting for the process goes through the Go runtime's
// poller, so it holds no OS thread (a blocking wait4 would pin one). It
// depends on the standard library, x/sys/unix and errdefs only, so the
// per-sandbox supervisor can use it.
package pidfd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// FD is a pidfd: readable once the process has exited.
type FD struct {
	pid int
	f   *os.File
}

// Open opens a pidfd for pid; ErrNotFound when there is no such process.
func Open(pid int) (*FD, error) {
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
	return &FD{pid: pid, f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))}, nil
}

// Pid returns the process's pid.
func (p *FD) Pid() int { return p.pid }

// Dup returns a second handle on the same process (it outlives Close of p).
func (p *FD) Dup() (*FD, error) {
	fd, err := unix.FcntlInt(p.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicate pidfd of %d: %w", p.pid, err)
	}
	return &FD{pid: p.pid, f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", p.pid))}, nil
}

// Exited reports whether the process has terminated, without blocking.
func (p *FD) Exited() bool {
	var done bool
	rc, err := p.f.SyscallConn()
	if err != nil {
		return true
	}
	_ = rc.Control(func(fd uintptr) { done = readable(int(fd)) })
	return done
}

func readable(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return err != nil || (n > 0 && fds[0].Revents != 0)
	}
}

// ExitedWithin reports whether the process exits within d (bounded by
// ctx as well); it returns at once if it already has.
func (p *FD) ExitedWithin(ctx context.Context, d time.Duration) bool {
	if p.Exited() {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return p.Wait(ctx) == nil
}

// Wait blocks until the process has exited or ctx ends.
func (p *FD) Wait(ctx context.Context) error {
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
	err = rc.Read(func(fd uintptr) bool { return readable(int(fd)) })
	if err != nil {
		// The fd's deadline is ctx's and may fire a moment before ctx
		// reports it: both mean the process outlived the wait.
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			cause := ctx.Err()
			if cause == nil {
				cause = context.DeadlineExceeded
			}
			return fmt.Errorf("waiting for process %d: %w: %w", p.pid, errdefs.ErrUnavailable, cause)
		}
		return fmt.Errorf("waiting for process %d: %w", p.pid, err)
	}
	return nil
}

// Kill sends SIGKILL through the pidfd (never to a recycled pid). A
// process that has exited already is not an error.
func (p *FD) Kill() error {
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

// Close releases the pidfd; the process is not touched.
func (p *FD) Close() error { return p.f.Close() }

// Exit is how a child process ended.
type Exit struct {
	Code   int    // the exit code, -1 when killed by a signal
	Signal string // the signal's name ("SIGKILL") when killed by one
}

// ChildExit returns how the process, a child of this one, ended; call it
// once it has exited. With reap false the child stays a zombie (WNOWAIT),
// so that a later ChildExit(true), in this process image or the next one
// after an exec, collects it.
func (p *FD) ChildExit(reap bool) (Exit, error) {
	opts := unix.WEXITED | unix.WNOHANG
	if !reap {
		opts |= unix.WNOWAIT
	}
	var info unix.Siginfo
	var werr error
	rc, err := p.f.SyscallConn()
	if err != nil {
		return Exit{}, err
	}
	if err := rc.Control(func(fd uintptr) {
		for {
			werr = unix.Waitid(unix.P_PIDFD, int(fd), &info, opts, nil)
			if !errors.Is(werr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return Exit{}, err
	}
	if werr != nil {
		return Exit{}, fmt.Errorf("waitid %d: %w", p.pid, werr)
	}
	return exitOf(&info)
}

// sigchld is the head of a siginfo_t for SIGCHLD (unix.Siginfo keeps the
// union opaque): si_signo, si_errno, si_code, padding, then si_pid,
// si_uid, si_status.
type sigchld struct {
	Signo, Errno, Code, _ int32
	Pid, UID, Status      int32
}

// si_code values of SIGCHLD (<asm-generic/siginfo.h>).
const (
	cldExited = 1
	cldKilled = 2
	cldDumped = 3
)

func exitOf(info *unix.Siginfo) (Exit, error) {
	ci := (*sigchld)(unsafe.Pointer(info))
	switch ci.Code {
	case cldExited:
		return Exit{Code: int(ci.Status)}, nil
	case cldKilled, cldDumped:
		return Exit{Code: -1, Signal: unix.SignalName(syscall.Signal(ci.Status))}, nil
	case 0:
		if ci.Pid == 0 {
			return Exit{}, fmt.Errorf("process has not exited: %w", errdefs.ErrFailedPrecondition)
		}
	}
	return Exit{}, fmt.Errorf("process %d: unexpected wait code %d", ci.Pid, ci.Code)
}
