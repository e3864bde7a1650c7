package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ReadyWait hands the wait for the sandbox's readiness to the supervisor:
// the shim execs it as soon as the init runs in its cgroup, so that the
// supervisor's exec and runtime start overlap the sandbox's own start
// instead of following it. The supervisor then reports "done" once the
// init wrote to its ready fd, or the failure (with the tail of InitLog).
type ReadyWait struct {
	// FD is the read end of the init's ready pipe, inherited across the
	// exec (0: the sandbox is ready already, nothing to wait for).
	FD      int
	Timeout time.Duration
	// InitLog is the file holding the init's output, quoted on failure.
	InitLog string
}

// Args returns the supervisor's flags for r (none when FD is 0).
func (r ReadyWait) Args() []string {
	if r.FD <= 0 {
		return nil
	}
	return []string{"--ready-fd", strconv.Itoa(r.FD), "--ready-timeout", r.Timeout.String(), "--init-log", r.InitLog}
}

// wait blocks until the ready fd gets its byte, the init exits (done
// is closed and status says how), or the timeout passes.
func (r ReadyWait) wait(done <-chan struct{}, status func() ExitStatus) error {
	// Non-blocking, so that the runtime's poller gives Read a deadline.
	if err := unix.SetNonblock(r.FD, true); err != nil {
		return fmt.Errorf("ready fd %d: %w: %w", r.FD, errdefs.ErrFailedPrecondition, err)
	}
	f := os.NewFile(uintptr(r.FD), "ready")
	if f == nil {
		return fmt.Errorf("ready fd %d is not open: %w", r.FD, errdefs.ErrFailedPrecondition)
	}
	defer f.Close()
	err := r.read(f, done, status)
	if err != nil {
		if tail, _ := LogTail(r.InitLog, 2048); strings.TrimSpace(tail) != "" {
			tail = strings.TrimSpace(tail)
			err = fmt.Errorf("%w; init output: %s", err, tail)
		}
	}
	return err
}

func (r ReadyWait) read(f *os.File, done <-chan struct{}, status func() ExitStatus) error {
	if err := f.SetReadDeadline(time.Now().Add(r.Timeout)); err != nil {
		return err
	}
	var b [1]byte
	n, err := f.Read(b[:])
	switch {
	case n == 1:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("sandbox init not ready after %s: %w", r.Timeout, errdefs.ErrUnavailable)
	case errors.Is(err, io.EOF):
		// The ready fd closed: init exited (or closed it) before writing.
		select {
		case <-done:
			s := status()
			sig := ""
			if s.Signal != "" {
				sig = ", signal " + s.Signal
			}
			return fmt.Errorf("sandbox init exited before it was ready (exit code %d%s): %w",
				s.ExitCode, sig, errdefs.ErrFailedPrecondition)
		case <-time.After(2 * time.Second):
			return fmt.Errorf("sandbox init closed its ready fd without writing: %w", errdefs.ErrFailedPrecondition)
		}
	default:
		return fmt.Errorf("read init readiness: %w", err)
	}
}

// LogTail returns the last n bytes of the file at path (the init's log)
// and whether they start mid-file; "" when it cannot be read.
func LogTail(path string, n int64) (tail string, cut bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", false
	}
	off := max(fi.Size()-n, 0)
	b := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil {
		return "", false
	}
	return string(b), off > 0
}
