package supervisor

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Child is a handle on a child process of this one by pidfd. Waiting for
// it goes through the runtime's poller, so it holds no OS thread (a
// blocking wait4 would pin one for the sandbox's whole life).
type Child struct {
	pid int
	f   *os.File
}

// OpenChild returns a handle on pid, which must be an unreaped child of
// this process (its pid cannot be reused before it is reaped).
func OpenChild(pid int) (*Child, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, errdefs.ErrInvalidArgument)
	}
	// A look that neither blocks nor reaps: ECHILD when pid is not ours.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		if errors.Is(err, syscall.ECHILD) {
			return nil, fmt.Errorf("process %d is not a child of %d: %w", pid, os.Getpid(), errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("waitid %d: %w", pid, err)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	return &Child{pid: pid, f: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))}, nil
}

// Pid returns the child's pid.
func (c *Child) Pid() int { return c.pid }

// WaitExited blocks until the child has exited.
func (c *Child) WaitExited() error {
	rc, err := c.f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool { return pidfdReadable(int(fd)) })
}

// Status returns how the child ended; call it once WaitExited returned.
// With reap false the child stays a zombie (WNOWAIT), so that a later
// Status(true), in this process image or the next one after an exec,
// collects it.
func (c *Child) Status(reap bool) (ExitStatus, error) {
	opts := unix.WEXITED | unix.WNOHANG
	if !reap {
		opts |= unix.WNOWAIT
	}
	var info unix.Siginfo
	var werr error
	rc, err := c.f.SyscallConn()
	if err != nil {
		return ExitStatus{}, err
	}
	if err := rc.Control(func(fd uintptr) {
		for {
			werr = unix.Waitid(unix.P_PIDFD, int(fd), &info, opts, nil)
			if !errors.Is(werr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return ExitStatus{}, err
	}
	if werr != nil {
		return ExitStatus{}, fmt.Errorf("waitid %d: %w", c.pid, werr)
	}
	return exitStatusOf(&info)
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

func exitStatusOf(info *unix.Siginfo) (ExitStatus, error) {
	ci := (*sigchld)(unsafe.Pointer(info))
	e := ExitStatus{ExitCode: -1, ExitedAt: time.Now().UTC()}
	switch ci.Code {
	case 0:
		if ci.Pid == 0 {
			return ExitStatus{}, fmt.Errorf("process has not exited: %w", errdefs.ErrFailedPrecondition)
		}
	case cldExited:
		e.ExitCode = int(ci.Status)
	case cldKilled, cldDumped:
		e.Signal = unix.SignalName(syscall.Signal(ci.Status))
	default:
		return ExitStatus{}, fmt.Errorf("process %d: unexpected wait code %d", ci.Pid, ci.Code)
	}
	return e, nil
}

// Kill sends SIGKILL through the pidfd: never to a recycled pid.
func (c *Child) Kill() error {
	var serr error
	rc, err := c.f.SyscallConn()
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

// Close releases the pidfd; the child is not touched.
func (c *Child) Close() error { return c.f.Close() }

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
