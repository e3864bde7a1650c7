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

	"github.com/cube-dev/cube/internal/cgroup/control"
)

func isBusy(err error) bool { return errors.Is(err, syscall.EBUSY) }

// Control returns the cgroup by its directories, for acting on its
// processes (see package control).
func (c *Cgroup) Control() control.Group {
	if c.layout.Version == V2 {
		d := c.dirs["unified"]
		return control.Group{V2: true, Dirs: []string{d}, Freezer: d}
	}
	return control.Group{Dirs: uniqueDirs(c.dirs), Freezer: c.dirs["freezer"]}
}

// Freeze stops every process in the cgroup and waits until the kernel
// reports the cgroup frozen (bounded by ctx).
func (c *Cgroup) Freeze(ctx context.Context) error { return c.Control().Freeze(ctx) }

// Thaw resumes the processes of a frozen cgroup.
func (c *Cgroup) Thaw(ctx context.Context) error { return c.Control().Thaw(ctx) }

// Kill SIGKILLs every process in the cgroup and waits until it is empty
// (bounded by ctx); a missing cgroup is not an error (see control.Group.Kill).
func (c *Cgroup) Kill(ctx context.Context) error { return c.Control().Kill(ctx) }

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
		if err := control.WriteFile(filepath.Join(dir, f), pb); err != nil {
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
