// Package control acts on the processes of an existing cgroup: it lists,
// freezes, thaws and kills them. It depends on nothing but the standard
// library and errdefs, so the per-sandbox supervisor, which holds a Group
// for its sandbox's whole life, stays small; creating cgroups and setting
// limits (which needs eBPF on cgroup v2) is package cgroup's job.
package control

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Group is one cgroup, by its directories.
type Group struct {
	// V2 is true on the unified hierarchy (cgroup v2).
	V2 bool `json:"v2"`
	// Dirs are the cgroup's directories, one per mounted hierarchy that
	// holds it (one on v2), sorted and distinct.
	Dirs []string `json:"dirs"`
	// Freezer is the directory whose freezer file stops the cgroup: the
	// unified directory on v2, the freezer hierarchy's on v1 ("" when that
	// hierarchy is not mounted).
	Freezer string `json:"freezer,omitempty"`
}

// Procs returns the pids in the cgroup (in any of its hierarchies), sorted;
// ErrNotFound when none of its directories exists.
func (g Group) Procs() ([]int, error) {
	var out []int
	found := false
	for _, d := range g.Dirs {
		pids, err := ReadPids(filepath.Join(d, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		found = true
		for _, p := range pids {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("cgroup %v: %w", g.Dirs, errdefs.ErrNotFound)
	}
	slices.Sort(out)
	return out, nil
}

// ReadPids reads a cgroup.procs (or tasks) file.
func ReadPids(file string) ([]int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", file, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Freeze stops every process in the cgroup and waits until the kernel
// reports the cgroup frozen (bounded by ctx).
func (g Group) Freeze(ctx context.Context) error {
	return g.setFrozen(ctx, true)
}

// Thaw resumes the processes of a frozen cgroup.
func (g Group) Thaw(ctx context.Context) error {
	return g.setFrozen(ctx, false)
}

func (g Group) setFrozen(ctx context.Context, frozen bool) error {
	dir := g.Freezer
	if dir == "" {
		return fmt.Errorf("cgroup v1 freezer is not mounted: %w", errdefs.ErrUnavailable)
	}
	if !g.V2 && frozen {
		return freezeV1(ctx, dir)
	}
	var file, value, want string
	if g.V2 {
		file, value = "cgroup.freeze", "0"
		if frozen {
			value = "1"
		}
	} else {
		file, value = "freezer.state", "THAWED"
		if frozen {
			value = "FROZEN"
		}
	}
	if err := writeState(dir, file, value); err != nil {
		return err
	}
	// Wait for the transition: v1 passes through FREEZING, v2 reports it in
	// cgroup.events.
	if g.V2 {
		file, want = "cgroup.events", "frozen 0"
		if frozen {
			want = "frozen 1"
		}
	} else {
		want = value
	}
	return PollUntil(ctx, stateHas(dir, file, want))
}

// writeState writes value to the control file of the cgroup at dir; a
// cgroup that is gone is ErrNotFound.
func writeState(dir, file, value string) error {
	if err := WriteFile(filepath.Join(dir, file), []byte(value)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup %s: %w", dir, errdefs.ErrNotFound)
		}
		return fmt.Errorf("write %s=%s in %s: %w", file, value, dir, err)
	}
	return nil
}

// stateHas is a PollUntil condition: the control file of the cgroup at dir
// contains want.
func stateHas(dir, file, want string) func() (bool, error) {
	return func() (bool, error) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return false, fmt.Errorf("read %s in %s: %w", file, dir, err)
		}
		return strings.Contains(string(b), want), nil
	}
}

// freezeV1 freezes a v1 freezer cgroup. One write of FROZEN is not enough
// there: while the cgroup's tasks fork, the kernel can leave it FREEZING
// for good (a child born during the walk is missed). Each new write walks
// the tasks again, so Freeze writes FROZEN, gives the kernel a moment, and
// writes again; every few attempts it thaws first, which lets tasks stuck
// on the way to the refrigerator (in a vfork, say) run out of it.
func freezeV1(ctx context.Context, dir string) error {
	for attempt := 1; ; attempt++ {
		if attempt%10 == 0 {
			if err := writeState(dir, "freezer.state", "THAWED"); err != nil {
				return err
			}
		}
		if err := writeState(dir, "freezer.state", "FROZEN"); err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := PollUntil(actx, stateHas(dir, "freezer.state", "FROZEN"))
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("freeze %s after %d attempts: %w", dir, attempt, err)
		case actx.Err() == nil: // reading the state failed
			return err
		}
	}
}

// Kill SIGKILLs every process in the cgroup and waits until it is empty
// (bounded by ctx). v2 uses cgroup.kill; v1 freezes the cgroup so nothing
// can fork, signals every pid, thaws, and repeats until empty. A missing
// cgroup is not an error.
func (g Group) Kill(ctx context.Context) error {
	if _, err := g.Procs(); errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if g.V2 && len(g.Dirs) == 1 {
		err := WriteFile(filepath.Join(g.Dirs[0], "cgroup.kill"), []byte("1"))
		if err == nil {
			return g.waitEmpty(ctx)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("cgroup.kill: %w", err)
		}
		// Kernels before 5.14 have no cgroup.kill: signal pids instead.
	}
	for {
		pids, err := g.Procs()
		if errors.Is(err, errdefs.ErrNotFound) || (err == nil && len(pids) == 0) {
			return nil
		}
		if err != nil {
			return err
		}
		// Freezing is best effort: a task stuck in the kernel may keep the
		// cgroup FREEZING; killing still makes progress then.
		fctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		frozen := g.Freeze(fctx) == nil
		cancel()
		if pids, err = g.Procs(); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		for _, p := range pids {
			if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill pid %d: %w", p, err)
			}
		}
		if frozen || g.Freezer != "" {
			if err := g.Thaw(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnavailable) {
				return err
			}
		}
		if err := g.waitEmpty(ctx); err == nil {
			return nil
		} else if ctx.Err() != nil {
			return err
		}
	}
}

// waitEmpty waits until the cgroup has no processes, up to 1 s per call
// and never beyond ctx.
func (g Group) waitEmpty(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return PollUntil(ctx, func() (bool, error) {
		pids, err := g.Procs()
		if errors.Is(err, errdefs.ErrNotFound) {
			return true, nil
		}
		return err == nil && len(pids) == 0, err
	})
}

// PollUntil calls cond with a growing delay (1 ms to 20 ms) until it reports
// true, fails, or ctx ends. Used where the kernel offers no notification
// (v1 freezer state, v1 emptiness).
func PollUntil(ctx context.Context, cond func() (bool, error)) error {
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

// WriteFile writes a control file. Unlike os.WriteFile it never creates the
// file: cgroupfs refuses creation, and a missing file must read as
// fs.ErrNotExist.
func WriteFile(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
