package control

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// A cgroup that does not exist has no processes to kill, and cannot be
// frozen; a v1 host without the freezer hierarchy says so. (Package cgroup's
// tests run Kill, Freeze and Thaw against real cgroups.)
func TestMissingGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "gone")
	g := Group{Dirs: []string{dir}, Freezer: dir}
	if _, err := g.Procs(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Procs: %v, want ErrNotFound", err)
	}
	if err := g.Kill(ctx); err != nil {
		t.Errorf("Kill: %v, want nil", err)
	}
	if err := g.Freeze(ctx); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Freeze: %v, want ErrNotFound", err)
	}
	if err := (Group{Dirs: []string{dir}}).Freeze(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Freeze without a freezer: %v, want ErrUnavailable", err)
	}
}

// Procs merges the pids of every hierarchy, once each, sorted.
func TestProcsMergesHierarchies(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(a, "cgroup.procs"), []byte("30\n10\n"), 0o644)
	os.WriteFile(filepath.Join(b, "cgroup.procs"), []byte("10\n20\n"), 0o644)
	got, err := Group{Dirs: []string{a, b}}.Procs()
	if err != nil || !slices.Equal(got, []int{10, 20, 30}) {
		t.Errorf("Procs = %v, %v", got, err)
	}
	os.WriteFile(filepath.Join(b, "cgroup.procs"), []byte("x\n"), 0o644)
	if _, err := (Group{Dirs: []string{b}}).Procs(); err == nil {
		t.Error("a malformed cgroup.procs was accepted")
	}
}

// WriteFile never creates a control file: a missing one is ErrNotExist.
func TestWriteFileDoesNotCreate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cgroup.freeze")
	if err := WriteFile(p, []byte("1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("WriteFile of a missing file: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file created: %v", err)
	}
}

func TestPollUntil(t *testing.T) {
	n := 0
	if err := PollUntil(context.Background(), func() (bool, error) { n++; return n == 3, nil }); err != nil || n != 3 {
		t.Errorf("PollUntil = %v after %d calls", err, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := PollUntil(ctx, func() (bool, error) { return false, nil }); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("PollUntil past the deadline: %v", err)
	}
}
