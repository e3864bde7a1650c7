// Package cgroup manages the cgroup of one sandbox on cgroup v1 hosts
// (separate controller hierarchies) and cgroup v2 hosts (unified hierarchy):
// creation with limits, membership, statistics, freezing, killing and removal.
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/cube-dev/cube/internal/cgroup/control"
	"github.com/cube-dev/cube/internal/errdefs"
)

// DefaultParent is the cgroup under which sandbox cgroups are created.
const DefaultParent = "cube"

// Cgroup is the cgroup of one sandbox: <parent>/<id> in every sandbox
// controller hierarchy (v1) or in the unified hierarchy (v2).
type Cgroup struct {
	layout Layout
	parent string
	id     string
	dirs   map[string]string // controller -> directory
}

// Open returns a handle on the cgroup <parent>/<id> on this host. It does not
// create anything. An empty parent means DefaultParent.
func Open(parent, id string) (*Cgroup, error) {
	l, err := DetectLayout()
	if err != nil {
		return nil, err
	}
	return OpenLayout(l, parent, id)
}

// OpenLayout is Open with an explicit layout.
func OpenLayout(l Layout, parent, id string) (*Cgroup, error) {
	if parent == "" {
		parent = DefaultParent
	}
	if err := validateName("parent", parent, true); err != nil {
		return nil, err
	}
	if err := validateName("id", id, false); err != nil {
		return nil, err
	}
	rel := filepath.Join(parent, id)
	return &Cgroup{layout: l, parent: parent, id: id, dirs: l.dirs(rel)}, nil
}

// OpenParent returns a handle on parent itself (the cgroup sandbox cgroups
// are made under), whose Stats are the usage of all of them together.
func OpenParent(parent string) (*Cgroup, error) {
	if parent == "" {
		parent = DefaultParent
	}
	if err := validateName("parent", parent, true); err != nil {
		return nil, err
	}
	l, err := DetectLayout()
	if err != nil {
		return nil, err
	}
	return &Cgroup{layout: l, parent: filepath.Dir(parent), id: filepath.Base(parent), dirs: l.dirs(parent)}, nil
}

// Version returns the cgroup version in use.
func (c *Cgroup) Version() Version { return c.layout.Version }

// Dir returns the directory of the cgroup for a v1 controller ("memory",
// "pids", ...) or, on v2, the single unified directory whatever the argument.
func (c *Cgroup) Dir(controller string) string {
	if c.layout.Version == V2 {
		return c.dirs["unified"]
	}
	return c.dirs[controller]
}

// Create makes the cgroup (idempotently) and applies r.
func (c *Cgroup) Create(r Resources) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if c.layout.Version == V2 {
		if err := enableControllersV2(c.layout.Unified, c.parent); err != nil {
			return err
		}
	}
	for _, d := range uniqueDirs(c.dirs) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
	}
	return c.SetResources(r)
}

// SetResources (re)applies r to an existing cgroup.
func (c *Cgroup) SetResources(r Resources) error {
	if err := r.Validate(); err != nil {
		return err
	}
	for _, w := range limitWrites(c.layout.Version, r) {
		d, ok := c.dirs[w.Controller]
		if !ok && w.Controller == "devices" {
			continue // no devices hierarchy: the allowlist is best effort (see deviceWrites)
		}
		if !ok {
			return fmt.Errorf("cgroup controller %s is not mounted: %w", w.Controller, errdefs.ErrUnavailable)
		}
		err := control.WriteFile(filepath.Join(d, w.File), []byte(w.Value))
		if err != nil && !(w.Optional && errors.Is(err, fs.ErrNotExist)) {
			return fmt.Errorf("set cgroup limit %s=%s: %w", w.File, w.Value, err)
		}
	}
	if c.layout.Version == V2 && r.Devices != nil {
		err := setDevicesV2(c.dirs["unified"], r.Devices)
		if errors.Is(err, errdefs.ErrUnavailable) {
			// Like a v1 host without a devices hierarchy: best effort.
			slog.Warn("cgroup: no device allowlist for sandbox", "cgroup", c.dirs["unified"], "err", err)
			return nil
		}
		if err != nil {
			return fmt.Errorf("set cgroup device allowlist: %w", err)
		}
	}
	return nil
}

// enableControllersV2 turns on cpu, memory and pids for the children of
// every directory from the root down to parent.
func enableControllersV2(unified, parent string) error {
	for _, d := range ancestorsV2(unified, parent) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
		for _, ctl := range []string{"cpu", "memory", "pids"} {
			if err := control.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+"+ctl)); err != nil {
				return fmt.Errorf("enable controller %s in %s: %w", ctl, d, err)
			}
		}
	}
	return nil
}

// AddProc moves pid (a whole process) into the cgroup.
func (c *Cgroup) AddProc(pid int) error {
	for _, d := range uniqueDirs(c.dirs) {
		if err := writeProc(d, pid); err != nil {
			return err
		}
	}
	return nil
}

func writeProc(dir string, pid int) error {
	err := control.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cgroup %s: %w", dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("add pid %d to cgroup %s: %w", pid, dir, err)
	}
	return nil
}

// Procs returns the pids in the cgroup (in any hierarchy), sorted;
// ErrNotFound when the cgroup does not exist.
func (c *Cgroup) Procs() ([]int, error) { return c.Control().Procs() }

// Remove deletes the cgroup. It is idempotent and retries briefly (up to
// 2 s in all) while the kernel still reports it busy because processes are
// just exiting; a cgroup that still has processes fails at once with
// ErrFailedPrecondition (Kill it first).
func (c *Cgroup) Remove(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var errs []error
	for _, d := range uniqueDirs(c.dirs) {
		errs = append(errs, removeDir(ctx, d))
	}
	return errors.Join(errs...)
}

func removeDir(ctx context.Context, dir string) error {
	delay := time.Millisecond
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !isBusy(err) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		if pids, _ := control.ReadPids(filepath.Join(dir, "cgroup.procs")); len(pids) > 0 {
			return fmt.Errorf("remove cgroup %s: %d processes left, kill them first: %w", dir, len(pids), errdefs.ErrFailedPrecondition)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove cgroup %s: still busy: %w", dir, errdefs.ErrUnavailable)
		case <-time.After(delay):
		}
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// List returns the ids of the cgroups present under parent (the union over
// the sandbox hierarchies), sorted. A missing parent yields no ids.
func List(parent string) ([]string, error) {
	l, err := DetectLayout()
	if err != nil {
		return nil, err
	}
	return ListLayout(l, parent)
}

// ListLayout is List with an explicit layout.
func ListLayout(l Layout, parent string) ([]string, error) {
	if parent == "" {
		parent = DefaultParent
	}
	if err := validateName("parent", parent, true); err != nil {
		return nil, err
	}
	var ids []string
	for _, d := range uniqueDirs(l.dirs(parent)) {
		ents, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list cgroups in %s: %w", d, err)
		}
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(ids, e.Name()) {
				ids = append(ids, e.Name())
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}
