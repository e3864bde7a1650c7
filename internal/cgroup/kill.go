package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

func isBusy(err error) bool { return errors.Is(err, syscall.EBUSY) }

// Freeze stops every process in the cgroup and waits until the kernel
// reports the cgroup frozen (bounded by ctx).
func (c *Cgroup) Freeze(ctx context.Context) error {
	return c.setFrozen(ctx, true)
}

// Thaw resumes the processes of a frozen cgroup.
func (c *Cgroup) Thaw(ctx context.Context) error {
	return c.setFrozen(ctx, false)
}

func (c *Cgroup) setFrozen(ctx context.Context, frozen bool) error {
	var file, value, want string
	var dir string
	if c.layout.Version == V2 {
		dir, file, value = c.dirs["unified"], "cgroup.freeze", "0"
		if frozen {
			value = "1"
		}
	} else {
		dir = c.dirs["freezer"]
		if dir == "" {
			return fmt.Errorf("cgroup v1 freezer is not mounted: %w", errdefs.ErrUnavailable)
		}
		file, value = "freezer.state", "THAWED"
		if frozen {
			value = "FROZEN"
		}
	}
	if err := writeFile(filepath.Join(dir, file), []byte(value)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup %s: %w", dir, errdefs.ErrNotFound)
		}
		return fmt.Errorf("write %s=%s in %s: %w", file, value, dir, err)
	}
	// Wait for the transition: v1 passes through FREEZING, v2 reports it in
	// cgroup.events.
	if c.layout.Version == V2 {
		file, want = "cgroup.events", "frozen 0"
		if frozen {
			want = "frozen 1"
		}
	} else {
		want = value
	}
	return pollUntil(ctx, func() (bool, error) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return false, fmt.Errorf("read %s in %s: %w", file, dir, err)
		}
		return strings.Contains(string(b), want), nil
	})
}

// Kill SIGKILLs every process in the cgroup and waits until it is empty
// (bounded by ctx). v2 uses cgroup.kill; v1 freezes the cgroup so nothing
// can fork, signals every pid, thaws, and repeats until empty. A missing
// cgroup is not an error.
func (c *Cgroup) Kill(ctx context.Context) error {
	if _, err := c.Procs(); errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if c.layout.Version == V2 {
		err := writeFile(filepath.Join(c.dirs["unified"], "cgroup.kill"), []byte("1"))
		if err == nil {
			return c.waitEmpty(ctx)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup.kill: %w", err)
		}
		// Kernels before 5.14 have no cgroup.kill: signal pids instead.
	}
	for {
		pids, err := c.Procs()
		if errors.Is(err, errdefs.ErrNotFound) || (err == nil && len(pids) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
		// Freezing is best effort: a task stuck in the kernel may keep the
		// cgroup FREEZING; killing still makes progress then.
		fctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		frozen := c.Freeze(fctx) == nil
		cancel()
		if pids, err = c.Procs(); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		for _, p := range pids {
			if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill pid %d: %w", p, err)
			}
		}
		if frozen || c.dirs["freezer"] != "" || c.layout.Version == V2 {
			if err := c.Thaw(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) {
				return err
			}
		}
		if err := c.waitEmpty(ctx); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return err
		}
	}
}

// waitEmpty waits until the cgroup has no processes, up to 1 s per call
// and never beyond ctx.
func (c *Cgroup) waitEmpty(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return pollUntil(ctx, func() (bool, error) {
		pids, err := c.Procs()
		if errors.Is(err, errdefs.ErrNotFound) {
			return true, nil
		}
		return err == nil && len(pids) == 0, err
	})
}

// pollUntil calls cond with a growing delay (1 ms to 20 ms) until it reports
// true, fails, or ctx ends. Used where the kernel offers no notification
// (v1 freezer state, v1 emptiness).
func pollUntil(ctx context.Context, cond func() (bool, error)) error {
	delay := time.Millisecond
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for cgroup: %w: %w", errdefs.ErrUnavailable, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
}

// MoveAll moves pid into the cgroup name (relative to each hierarchy's
// root) in every mounted hierarchy, v1 controllers, named v1 hierarchies and
// the unified one alike, creating it as needed. Shims use it to leave the
// agent's cgroups, so that stopping the agent's service or Pod cannot reach
// them. The cgroup carries no limits and is shared; it is never removed.
func MoveAll(name string, pid int) error {
	if err := validateName("name", name, true); err != nil {
		return err
	}
	l, err := DetectLayout()
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range l.allHierarchyDirs(name) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			errs = append(errs, fmt.Errorf("create cgroup %s: %w", d, err))
			continue
		}
		if err := initCpuset(d); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, writeProc(d, pid))
	}
	return errors.Join(errs...)
}

// initCpuset copies cpuset.cpus and cpuset.mems from the parent when dir is
// a fresh v1 cpuset cgroup (it accepts no task until both are set).
func initCpuset(dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if errors.Is(err, fs.ErrNotExist) {
			return nil // not a v1 cpuset hierarchy
		}
		if err != nil {
			return fmt.Errorf("read %s in %s: %w", f, dir, err)
		}
		if strings.TrimSpace(string(b)) != "" {
			continue
		}
		pb, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return fmt.Errorf("read parent %s of %s: %w", f, dir, err)
		}
		if err := writeFile(filepath.Join(dir, f), pb); err != nil {
			return fmt.Errorf("set %s in %s: %w", f, dir, err)
		}
	}
	return nil
}

// DeleteEverywhere removes the cgroup name from every mounted hierarchy, the
// counterpart of MoveAll (also usable for an emptied parent). Missing
// directories are fine; one that still holds processes or children fails.
func DeleteEverywhere(ctx context.Context, name string) error {
	if err := validateName("name", name, true); err != nil {
		return err
	}
	l, err := DetectLayout()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var errs []error
	for _, d := range l.allHierarchyDirs(name) {
		errs = append(errs, removeDir(ctx, d))
	}
	return errors.Join(errs...)
}
