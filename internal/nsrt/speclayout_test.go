package nsrt

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/cube-dev/cube/internal/cgroup"
)

// The cgroup layout the agent passes in the spec reaches the shim through
// spec.json, and the shim's cgroup handle uses it instead of reading
// mountinfo; without one the shim reads the host's.
func TestSpecCarriesCgroupLayout(t *testing.T) {
	dir := t.TempDir()
	mnt := filepath.Join(dir, "cg")
	spec := Spec{ID: "sb1", StateDir: dir, CgroupParent: "cube-test", CgroupLayout: &cgroup.Layout{
		Version: cgroup.V1, V1: map[string]string{"memory": mnt + "/memory", "freezer": mnt + "/freezer", "pids": mnt + "/pids"}}}
	if err := writeSpec(spec); err != nil {
		t.Fatal(err)
	}
	read, err := readSpec(dir)
	if err != nil {
		t.Fatal(err)
	}
	cg, err := read.openCgroup()
	if err != nil {
		t.Fatal(err)
	}
	g := cg.Control()
	want := []string{mnt + "/freezer/cube-test/sb1", mnt + "/memory/cube-test/sb1", mnt + "/pids/cube-test/sb1"}
	if g.Freezer != want[0] || !slices.Equal(g.Dirs, want) {
		t.Fatalf("cgroup from the passed layout: %+v, want dirs %v", g, want)
	}

	read.CgroupLayout = nil
	host, err := read.openCgroup()
	if err != nil {
		t.Skipf("no cgroups here: %v", err)
	}
	if slices.Equal(host.Control().Dirs, want) {
		t.Fatal("without a layout the shim still used the passed one")
	}
}
