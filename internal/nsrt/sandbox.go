package nsrt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/mountns"
	"github.com/cube-dev/cube/internal/shim"
	"github.com/cube-dev/cube/internal/supervisor"
)

// Sandbox is a running sandbox, reached through its shim. Close releases
// the handle; the sandbox keeps running.
type Sandbox struct {
	stateDir string
	client   *shim.Client
}

// startGrace is how much longer than the ready timeout Start waits for the
// shim's report (shim start-up, cgroup and mount set-up).
const startGrace = 10 * time.Second

// Start starts a sandbox: it records spec in spec.json in the state dir and
// spawns `exe shim` detached from the caller, which starts the sandbox's
// init. It returns once init wrote to its ready fd, or an error (including
// the tail of init's output) after undoing everything it made. A state dir
// whose shim is still running yields ErrAlreadyExists.
func Start(ctx context.Context, exe string, spec Spec) (*Sandbox, error) {
	return StartIn(ctx, nil, exe, spec)
}

// StartIn is Start with the shim started in mount namespace ns (nil: this
// process's; see shim.SpawnIn): exe, the spec's paths and the binaries it
// binds in must name the same files there.
func StartIn(ctx context.Context, ns *mountns.NS, exe string, spec Spec) (_ *Sandbox, err error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	spec = spec.withDefaults()
	if c, derr := shim.Dial(ctx, spec.StateDir); derr == nil {
		c.Close()
		return nil, fmt.Errorf("sandbox %s: a shim is already running in %s: %w", spec.ID, spec.StateDir, errdefs.ErrAlreadyExists)
	}
	if ns == nil { // the shim sees the mounts this process sees
		l, err := cgroup.DetectLayout()
		if err != nil {
			return nil, err
		}
		spec.CgroupLayout = &l
	}
	cg, err := spec.openCgroup()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if cerr := errors.Join(cg.Kill(cctx), cg.Remove(cctx), removeStateFiles(spec.StateDir)); cerr != nil {
				err = fmt.Errorf("%w (cleanup: %v)", err, cerr)
			}
		}
	}()
	if err := writeSpec(spec); err != nil {
		return nil, fmt.Errorf("sandbox %s: write spec: %w", spec.ID, err)
	}
	sctx, cancel := context.WithTimeout(ctx, spec.ReadyTimeout+startGrace)
	defer cancel()
	// The shim starts in its cgroup rather than moving there (see
	// cgroup.JoinThread): one RCU grace period less per create on v1.
	shimCgroup := ShimCgroup(spec.CgroupParent)
	c, err := shim.SpawnPlaced(sctx, ns, exe, spec.StateDir, func() (int, error) { return cgroup.JoinThread(shimCgroup) })
	if err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	return &Sandbox{stateDir: spec.StateDir, client: c}, nil
}

// Attach re-dials the shim of a running sandbox, e.g. after an agent
// restart: ErrNotFound when no shim runs for stateDir, ErrUnavailable when
// its process lives but does not answer.
func Attach(ctx context.Context, stateDir string) (*Sandbox, error) {
	c, err := shim.Dial(ctx, stateDir)
	if err != nil {
		return nil, err
	}
	return &Sandbox{stateDir: stateDir, client: c}, nil
}

// ShimPID returns the pid of the sandbox's shim.
func (s *Sandbox) ShimPID() int { return s.client.Info().PID }

// InitPID returns the host pid of the sandbox's init.
func (s *Sandbox) InitPID() int { return s.client.Info().InitPID }

// AttachState is the state the supervisor reported when Attach reached it.
func (s *Sandbox) AttachState() supervisor.State { return s.client.DialState() }

// State returns the sandbox's state; after the shim has exited it is read
// from the exit record.
func (s *Sandbox) State(ctx context.Context) (supervisor.State, error) { return s.client.State(ctx) }

// Kill kills every process of the sandbox and waits until the shim has
// exited. It is idempotent.
func (s *Sandbox) Kill(ctx context.Context) error { return s.client.Kill(ctx) }

// Wait blocks until the shim has exited (the sandbox's init ended and was
// recorded) or ctx ends.
func (s *Sandbox) Wait(ctx context.Context) error { return s.client.Wait(ctx) }

// Freeze pauses every process of the sandbox.
func (s *Sandbox) Freeze(ctx context.Context) error { return s.client.Freeze(ctx) }

// Thaw resumes a frozen sandbox.
func (s *Sandbox) Thaw(ctx context.Context) error { return s.client.Thaw(ctx) }

// ExitWatch returns a watch on the shim process (see shim.Client.ExitWatch).
func (s *Sandbox) ExitWatch() (*shim.ExitWatch, error) { return s.client.ExitWatch() }

// Close releases the handle; the sandbox keeps running.
func (s *Sandbox) Close() error { return s.client.Close() }

// Cleanup removes what a sandbox left after Kill: its cgroup and its state
// dir. It kills the sandbox first if its shim still runs, is idempotent and
// keeps going past errors, returning them joined.
func Cleanup(ctx context.Context, stateDir, cgroupParent, id string) error {
	var errs []error
	if err := killRecorded(ctx, stateDir); err != nil {
		errs = append(errs, err)
	}
	if cg, err := cgroup.Open(cgroupParent, id); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, cg.Kill(ctx), cg.Remove(ctx))
	}
	errs = append(errs, removeStateDir(stateDir))
	return errors.Join(errs...)
}

// killRecorded kills the shim recorded in stateDir, if it still runs.
func killRecorded(ctx context.Context, stateDir string) error {
	c, err := shim.Dial(ctx, stateDir)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Kill(ctx)
}

// stateFiles are what Start and the shim create in a state dir.
var stateFiles = []string{SpecFile, InitLog, rootfsDir, upperDir, workDir, diskImage, diskMount,
	idmapLowerDir, idmapLayerDir,
	supervisor.InfoFile, supervisor.ExitFile, supervisor.SocketFile, supervisor.LogFile}

// removeStateFiles undoes a failed Start: it removes what Start and the shim
// made in the caller's state dir and leaves the dir itself.
func removeStateFiles(stateDir string) error {
	if err := refuseMountPoint(filepath.Join(stateDir, rootfsDir)); err != nil {
		return err
	}
	var errs []error
	for _, f := range stateFiles {
		errs = append(errs, os.RemoveAll(filepath.Join(stateDir, f)))
	}
	return errors.Join(errs...)
}

// removeStateDir removes the whole state dir, refusing to descend into a
// rootfs that is still a mount point on the host (it would reach the
// template through the overlay).
func removeStateDir(stateDir string) error {
	if err := refuseMountPoint(filepath.Join(stateDir, rootfsDir)); err != nil {
		return err
	}
	if err := os.RemoveAll(stateDir); err != nil {
		return fmt.Errorf("remove state dir: %w", err)
	}
	return nil
}

func refuseMountPoint(dir string) error {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	if st.Dev != parent.Dev {
		return fmt.Errorf("%s is a mount point on the host; unmount it first: %w", dir, errdefs.ErrFailedPrecondition)
	}
	return nil
}
