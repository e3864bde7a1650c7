package shim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/pidfd"
	"github.com/cube-dev/cube/internal/supervisor"
)

// Client talks to one running shim. Close it when done.
type Client struct {
	stateDir string
	info     supervisor.Info
	proc     *pidfd.FD
	dialed   supervisor.State // what the shim answered when Dial checked it
}

// Dial re-attaches to the shim recorded in stateDir. It fails with
// ErrNotFound when no shim was recorded or it has exited, and with
// ErrUnavailable when its process lives but does not answer.
func Dial(ctx context.Context, stateDir string) (*Client, error) {
	info, err := supervisor.ReadInfo(stateDir)
	if err != nil {
		return nil, fmt.Errorf("shim in %s: %w", stateDir, err)
	}
	proc, err := pidfd.Open(info.PID)
	if err != nil {
		return nil, fmt.Errorf("shim %d in %s is gone: %w", info.PID, stateDir, errdefs.ErrNotFound)
	}
	c := newClient(stateDir, info, proc)
	var st supervisor.State
	if err := c.call(ctx, "GET", "/state", &st); err != nil {
		gone := errors.Is(err, errdefs.ErrNotFound) || proc.ExitedWithin(ctx, dyingGrace)
		c.Close()
		if gone {
			return nil, fmt.Errorf("shim %d in %s has exited: %w", info.PID, stateDir, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("shim %d in %s does not answer: %w", info.PID, stateDir, err)
	}
	if st.ShimPID != info.PID {
		c.Close()
		return nil, fmt.Errorf("shim in %s reports pid %d, recorded %d: %w", stateDir, st.ShimPID, info.PID, errdefs.ErrConflict)
	}
	c.dialed = st
	return c, nil
}

// dyingGrace is how long Dial waits, after a failed call, for a shim
// that may be in the middle of exiting: a SIGKILLed multi-threaded shim
// keeps its listener open (and may accept a connection it never answers)
// until its last thread is gone, and a probe in that window must not
// mistake a dead shim for a silent one.
const dyingGrace = 250 * time.Millisecond

// DialState is the state the shim reported when Dial reached it (zero for
// a client from Spawn): a liveness probe needs no second round trip.
func (c *Client) DialState() supervisor.State { return c.dialed }

func newClient(stateDir string, info supervisor.Info, proc *pidfd.FD) *Client {
	return &Client{stateDir: stateDir, info: info, proc: proc}
}

// Info returns the shim's record (shim.json, written by the supervisor).
func (c *Client) Info() supervisor.Info { return c.info }

// Close releases the client's process handle (each call has its own
// connection); the shim keeps running.
func (c *Client) Close() error { return c.proc.Close() }

// State returns the sandbox's live state as the supervisor reports it.
// Once the shim has exited it is rebuilt from the records (Running false,
// exit code from exit.json).
func (c *Client) State(ctx context.Context) (supervisor.State, error) {
	var st supervisor.State
	err := c.call(ctx, "GET", "/state", &st)
	if err == nil {
		return st, nil
	}
	if !c.proc.Exited() {
		return supervisor.State{}, err
	}
	e, rerr := supervisor.ReadExit(c.stateDir)
	if rerr != nil {
		return supervisor.State{}, fmt.Errorf("shim %d exited without recording an exit status: %w", c.info.PID, errdefs.ErrNotFound)
	}
	return supervisor.State{ShimPID: c.info.PID, InitPID: c.info.InitPID, ExitCode: e.ExitCode, Signal: e.Signal,
		StartedAt: c.info.StartedAt, ExitedAt: e.ExitedAt, Version: c.info.Version}, nil
}

// Kill asks the shim to kill the sandbox and waits (bounded by ctx) until
// the shim process has exited. If the shim does not answer it is SIGKILLed,
// which takes its sandbox's init (and so its pid namespace) with it.
// Killing an exited shim succeeds.
func (c *Client) Kill(ctx context.Context) error {
	if c.proc.Exited() {
		return nil
	}
	if err := c.call(ctx, "POST", "/kill", nil); err != nil && !c.proc.Exited() {
		if kerr := c.proc.Kill(); kerr != nil {
			return fmt.Errorf("kill shim %d after %v: %w", c.info.PID, err, kerr)
		}
	}
	return c.Wait(ctx)
}

// Wait blocks until the shim process has exited or ctx ends.
func (c *Client) Wait(ctx context.Context) error { return c.proc.Wait(ctx) }

// Freeze pauses every process of the sandbox.
func (c *Client) Freeze(ctx context.Context) error {
	return c.call(ctx, "POST", "/freeze", nil)
}

// Thaw resumes a frozen sandbox.
func (c *Client) Thaw(ctx context.Context) error {
	return c.call(ctx, "POST", "/thaw", nil)
}

// ExitWatch reports whether one shim process has exited, by its pidfd: a
// poll, with no call to the shim. Close it when done.
type ExitWatch struct{ p *pidfd.FD }

// ExitWatch returns a watch on the shim this client reached. The pidfd
// was opened before Dial asked the shim who it is, so it names that very
// process, whatever pid reuse happens later.
func (c *Client) ExitWatch() (*ExitWatch, error) {
	p, err := c.proc.Dup()
	if err != nil {
		return nil, fmt.Errorf("shim %d: %w", c.info.PID, err)
	}
	return &ExitWatch{p: p}, nil
}

// Exited reports whether the shim process has terminated.
func (w *ExitWatch) Exited() bool { return w.p.Exited() }

// Close releases the pidfd.
func (w *ExitWatch) Close() error { return w.p.Close() }

// kindOf maps an HTTP status (as produced by errdefs.HTTPStatus) back to an
// error kind, so errors.Is works across the socket.
func kindOf(code int) error {
	for _, k := range []error{
		errdefs.ErrNotFound, errdefs.ErrConflict, errdefs.ErrInvalidArgument, errdefs.ErrFailedPrecondition,
		errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied,
	} {
		if errdefs.HTTPStatus(k) == code {
			return k
		}
	}
	return errors.New("internal error")
}
