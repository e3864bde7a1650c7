package supervisor

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/pidfd"
)

// Child is a handle on a child process of this one (the sandbox's init)
// by pidfd.
type Child struct{ *pidfd.FD }

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
	fd, err := pidfd.Open(pid)
	if err != nil {
		return nil, err
	}
	return &Child{fd}, nil
}

// Status returns how the child ended; call it once it has exited. With
// reap false it stays a zombie (see pidfd.FD.ChildExit).
func (c *Child) Status(reap bool) (ExitStatus, error) {
	e, err := c.ChildExit(reap)
	if err != nil {
		return ExitStatus{}, err
	}
	return ExitStatus{ExitCode: e.Code, Signal: e.Signal, ExitedAt: time.Now().UTC()}, nil
}
