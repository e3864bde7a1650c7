package preflight

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/proctest"
)

// TestMain doubles as the program RunInMountNS runs in the target mount
// namespace (as `cube kube share-mounts --here` is in the chart), and as a
// probe run in another netns.
func TestMain(m *testing.M) {
	if code, ok := childMain(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// childMain runs the child programs TestMain stands for, chosen by the
// environment; ok is false in the test binary's ordinary run.
func childMain() (code int, ok bool) {
	var res any
	var err error
	switch {
	case os.Getenv("CUBE_TEST_ENSURE_SHARED") != "":
		res, err = EnsureShared(strings.Split(os.Getenv("CUBE_TEST_ENSURE_SHARED"), ","))
	case os.Getenv("CUBE_TEST_RELEASE_SHARED") != "":
		res, err = ReleaseShared(strings.Split(os.Getenv("CUBE_TEST_RELEASE_SHARED"), ","))
	case os.Getenv("CUBE_TEST_PROBE_HOSTNETNS") == "1":
		res = ProbeHostNetNS("/proc")
	default:
		return 0, false
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1, true
	}
	return 0, true
}

// ensureSharedIn runs EnsureShared(dirs) in the mount namespace of pid the
// way the chart's init containers do: this test binary re-executed through
// nsenter, open as fd 3.
func ensureSharedIn(t *testing.T, pid int, dirs ...string) ([]SharedMount, string, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = RunInMountNS(context.Background(), fmt.Sprintf("/proc/%d/ns/mnt", pid), exe, nil,
		[]string{"CUBE_TEST_ENSURE_SHARED=" + strings.Join(dirs, ",")}, &stdout, &stderr)
	var res []SharedMount
	if jerr := json.Unmarshal(stdout.Bytes(), &res); jerr != nil && err == nil {
		t.Fatalf("output %q: %v (stderr %s)", stdout.String(), jerr, stderr.String())
	}
	return res, stderr.String(), err
}

// mountsAt returns the mounts of pid's namespace whose mount point is dir.
func mountsAt(t *testing.T, pid int, dir string) []MountInfo {
	t.Helper()
	mi, err := readMountInfo("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []MountInfo
	for _, m := range mi {
		if m.Point == dir {
			out = append(out, m)
		}
	}
	return out
}

func inNS(t *testing.T, pid int, argv ...string) {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--mount=/proc/" + strconv.Itoa(pid) + "/ns/mnt", "--"}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in the test mount namespace: %v: %v\n%s", argv, err, out)
	}
}

// TestEnsureSharedInAThrowawayMountNS plays a host whose / is a private
// mount (a mount namespace made with private propagation) and checks every
// case against the kernel's mountinfo: a plain directory is bound onto
// itself and made shared, in that namespace only; a rerun changes nothing
// (no second bind); a private mount point is made shared in place; a
// directory on a shared mount is left alone; a directory with mounts below
// it is refused with the fix named.
func TestEnsureSharedInAThrowawayMountNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount namespaces)")
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Fatal("nsenter (util-linux) is missing")
	}
	pid := proctest.StartPrintingPID(t, "unshare", "--mount", "--propagation", "private", "sh", "-c", "echo $$; exec sleep 300")
	base := t.TempDir()
	run, data := filepath.Join(base, "run", "cube"), filepath.Join(base, "lib", "cube") // created by EnsureShared

	res, stderr, err := ensureSharedIn(t, pid, run, data)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for i, dir := range []string{run, data} {
		if res[i].Dir != dir || res[i].Action != SharedBound || res[i].Mount != dir {
			t.Errorf("result %+v, want %s bound shared", res[i], dir)
		}
		if ms := mountsAt(t, pid, dir); len(ms) != 1 || !ms[0].Shared {
			t.Errorf("%s in the namespace: mounts %+v, want one shared", dir, ms)
		}
		if ms := mountsAt(t, os.Getpid(), dir); len(ms) != 0 {
			t.Errorf("%s: the bind leaked into the test's own namespace: %+v", dir, ms)
		}
	}

	// Rerun (a Pod restart, the other DaemonSet's init container): nothing
	// stacked.
	for range 2 {
		res, stderr, err = ensureSharedIn(t, pid, run, data)
		if err != nil {
			t.Fatalf("rerun: %v\n%s", err, stderr)
		}
		for i, dir := range []string{run, data} {
			if res[i].Action != SharedAlready {
				t.Errorf("rerun %s: %+v, want %q", dir, res[i], SharedAlready)
			}
			if ms := mountsAt(t, pid, dir); len(ms) != 1 {
				t.Errorf("rerun %s: %d mounts, want still 1", dir, len(ms))
			}
		}
	}

	// Its own mount point, private: made shared in place.
	own := filepath.Join(base, "own")
	if err := os.MkdirAll(own, 0o755); err != nil {
		t.Fatal(err)
	}
	inNS(t, pid, "mount", "-t", "tmpfs", "cube-test", own)
	if res, stderr, err = ensureSharedIn(t, pid, own); err != nil || res[0].Action != SharedMade {
		t.Errorf("own private mount: %+v %v %s", res, err, stderr)
	}
	if ms := mountsAt(t, pid, own); len(ms) != 1 || !ms[0].Shared {
		t.Errorf("own mount afterwards: %+v, want one shared", ms)
	}

	// Below a shared mount: left alone.
	shared := filepath.Join(base, "shared")
	if err := os.MkdirAll(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	inNS(t, pid, "mount", "-t", "tmpfs", "--make-shared", "cube-test", shared)
	sub := filepath.Join(shared, "sub")
	if res, stderr, err = ensureSharedIn(t, pid, sub); err != nil || res[0].Action != SharedAlready || res[0].Mount != shared {
		t.Errorf("under a shared mount: %+v %v %s", res, err, stderr)
	}
	if ms := mountsAt(t, pid, sub); len(ms) != 0 {
		t.Errorf("under a shared mount: bound anyway: %+v", ms)
	}

	// Mounts below a directory that needs a bind: refused, nothing done.
	busy := filepath.Join(base, "busy")
	if err := os.MkdirAll(filepath.Join(busy, "pin"), 0o755); err != nil {
		t.Fatal(err)
	}
	inNS(t, pid, "mount", "-t", "tmpfs", "cube-test", filepath.Join(busy, "pin"))
	_, stderr, err = ensureSharedIn(t, pid, busy)
	if err == nil || !strings.Contains(stderr, "mount --make-rshared") {
		t.Errorf("directory with mounts below: err %v, stderr %q; want a refusal naming the fix", err, stderr)
	}
	if ms := mountsAt(t, pid, busy); len(ms) != 0 {
		t.Errorf("refused, yet bound: %+v", ms)
	}
}

func TestParseMountInfo(t *testing.T) {
	const s = `22 1 8:1 / / rw,relatime - ext4 /dev/root rw
30 22 0:26 / /run rw,nosuid shared:5 - tmpfs tmpfs rw
31 30 0:26 /cube /run/cube rw shared:7 master:5 - tmpfs tmpfs rw
40 22 0:40 / /mnt/with\040space rw - tmpfs t rw
`
	got := ParseMountInfo(s)
	want := []MountInfo{{"/", false, "8:1", "/"}, {"/run", true, "0:26", "/"}, {"/run/cube", true, "0:26", "/cube"}, {"/mnt/with space", false, "0:40", "/"}}
	if !slices.Equal(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for path, point := range map[string]string{"/run/cube/netns": "/run/cube", "/run/cubex": "/run", "/var": "/", "/mnt/with space/x": "/mnt/with space"} {
		if m := mountOf(got, path); m.Point != point {
			t.Errorf("mountOf(%s) = %s, want %s", path, m.Point, point)
		}
	}
	// /run/cube is /run's tmpfs at /cube: a bind of itself; /run and / are not.
	for path, want := range map[string]bool{"/run/cube": true, "/run": false, "/": false, "/mnt/with space": false, "/var": false} {
		if got := isSelfBind(got, path); got != want {
			t.Errorf("isSelfBind(%s) = %t, want %t", path, got, want)
		}
	}
}

// TestReleaseSharedUndoesOnlyTheSelfBinds: at uninstall (cube node cleanup
// --purge-state) the binds EnsureShared made are unmounted, and a file
// system mounted on a Cube directory by the operator (here a tmpfs) stays:
// found on the first real cluster, where uninstall left both binds behind.
func TestReleaseSharedUndoesOnlyTheSelfBinds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount namespaces)")
	}
	pid := proctest.StartPrintingPID(t, "unshare", "--mount", "--propagation", "private", "sh", "-c", "echo $$; exec sleep 300")
	base := t.TempDir()
	run, data, disk := filepath.Join(base, "run", "cube"), filepath.Join(base, "lib", "cube"), filepath.Join(base, "disk")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	inNS(t, pid, "mount", "-t", "tmpfs", "cube-test-disk", disk)
	if _, stderr, err := ensureSharedIn(t, pid, run, data, disk); err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	// A bind stacked by hand on top of ours goes too.
	inNS(t, pid, "mount", "--bind", data, data)

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = RunInMountNS(context.Background(), fmt.Sprintf("/proc/%d/ns/mnt", pid), exe, nil,
		[]string{"CUBE_TEST_RELEASE_SHARED=" + strings.Join([]string{run, data, disk, filepath.Join(base, "missing")}, ",")}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	var released []string
	if err := json.Unmarshal(stdout.Bytes(), &released); err != nil {
		t.Fatalf("output %q: %v", stdout.String(), err)
	}
	if want := []string{run, data, data}; !slices.Equal(released, want) {
		t.Errorf("released %q, want %q", released, want)
	}
	for _, dir := range []string{run, data} {
		if ms := mountsAt(t, pid, dir); len(ms) != 0 {
			t.Errorf("%s: still mounted after release: %+v", dir, ms)
		}
	}
	if ms := mountsAt(t, pid, disk); len(ms) != 1 {
		t.Errorf("%s (the operator's tmpfs): %d mounts after release, want 1", disk, len(ms))
	}
}
