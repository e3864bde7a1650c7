package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/nativebin"
	"github.com/cube-dev/cube/internal/supervisor"
)

// containerImage is what `cube up` runs from when it plays the chart's
// cube-node container: a tmpfs (named source, so a process that still
// holds it can be found in any mountinfo) mounted on dir in the container's
// own mount namespace, holding cube and cube-shim.
type containerImage struct {
	source, dir, shim string
}

// wrap turns cmd (cube up from exe) into the container's start: a new mount
// namespace (a copy of the host's: data and run dirs are the same paths,
// the run dir a shared mount like a Bidirectional volume), the image tmpfs,
// then cube from the image, started in the image dir.
func (im *containerImage) wrap(cmd *exec.Cmd, exe string) {
	const script = `set -e; img=$2; mount -t tmpfs "$1" "$img"; cp "$3" "$img/cube"; cp "$4" "$img/cube-shim"; cd "$img"; shift 4; exec "$img/cube" "$@"`
	cmd.Path = "/bin/sh"
	cmd.Args = append([]string{"sh", "-c", script, "sh", im.source, im.dir, exe, im.shim}, cmd.Args[1:]...)
	cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
}

// runtimeBins are the installer's artifacts, built once: cube-shim,
// cube-reaper and two cube-supervisor builds of different versions.
var runtimeBins struct {
	once                                 sync.Once
	err                                  error
	shim, reaper, supOld, supNew, images string
}

const (
	oldVersion = "v0.0.1-it-old"
	newVersion = "v0.0.2-it-new"
)

func buildRuntime(t *testing.T) {
	t.Helper()
	needBins(t)
	runtimeBins.once.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		d := bins.dir
		runtimeBins.shim, runtimeBins.reaper = filepath.Join(d, "cube-shim"), filepath.Join(d, "cube-reaper")
		runtimeBins.supOld, runtimeBins.supNew = filepath.Join(d, "cube-supervisor-old"), filepath.Join(d, "cube-supervisor-new")
		for _, b := range []struct{ out, pkg, ver string }{
			{runtimeBins.shim, "./cmd/cube-shim", oldVersion},
			{runtimeBins.supOld, "./cmd/cube-supervisor", oldVersion}, {runtimeBins.supNew, "./cmd/cube-supervisor", newVersion},
		} {
			cmd := exec.Command("go", "build", "-ldflags", "-X github.com/cube-dev/cube/internal/version.Version="+b.ver, "-o", b.out, b.pkg)
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				runtimeBins.err = &buildError{b.pkg, err, string(out)}
				return
			}
		}
		runtimeBins.err = nativebin.Build(context.Background(), "cube-reaper", runtimeBins.reaper)
	})
	if runtimeBins.err != nil {
		t.Fatal(runtimeBins.err)
	}
}

type buildError struct {
	pkg string
	err error
	out string
}

func (e *buildError) Error() string { return "build " + e.pkg + ": " + e.err.Error() + "\n" + e.out }

// install copies src to dir/name the way `cube kube install-artifacts`
// does: a temporary file renamed into place (running processes keep the
// old file).
func install(t *testing.T, src, dir, name string) string {
	t.Helper()
	tmp := copyBinary(t, src, filepath.Join(dir, "."+name+".tmp"))
	dst := filepath.Join(dir, name)
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
	return dst
}

// holders lists the pids whose mount table holds a mount of source.
func holders(source string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/mountinfo")
		if err == nil && strings.Contains(string(b), " "+source+" ") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// supervisors maps each sandbox state dir (runtime name) of the node to its
// supervisor's record.
func (n *node) supervisors(t *testing.T) map[string]supervisor.Info {
	t.Helper()
	dir := filepath.Join(n.dataDir(), "node", "sandboxes")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]supervisor.Info{}
	for _, e := range ents {
		if info, err := supervisor.ReadInfo(filepath.Join(dir, e.Name())); err == nil {
			out[e.Name()] = info
		}
	}
	return out
}

func fileID(t *testing.T, path string) [2]uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint64{st.Dev, st.Ino}
}

// TestShimsLeaveTheContainer is the Big Pod with real processes: `cube up`
// runs in a mount namespace of its own from binaries on a tmpfs the host
// cannot see. Every supervisor must live in the host's mount namespace and
// run the installer's binaries from the host path, so nothing holds the
// container's mounts once cube is gone. Then the installer ships a new
// supervisor and cube restarts: the old pool slot is replaced, the user
// sandbox is adopted as it is, and `cube node doctor` shows both versions.
func TestShimsLeaveTheContainer(t *testing.T) {
	buildRuntime(t)
	ctx := context.Background()
	n := newNode(t)
	tag := filepath.Base(n.dir)
	arts := filepath.Join(n.dir, "artifacts")
	if err := os.MkdirAll(arts, 0o755); err != nil {
		t.Fatal(err)
	}
	n.envdPath = install(t, bins.envd, arts, "envd")
	install(t, runtimeBins.shim, arts, "cube-shim")
	reaper := install(t, runtimeBins.reaper, arts, "cube-reaper")
	sup := install(t, runtimeBins.supOld, arts, "cube-supervisor")
	// The run dir is shared with the host, as the chart's Bidirectional
	// volume is: netns pins made in the container reach the host.
	if err := os.MkdirAll(n.net.RunDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(n.net.RunDir, n.net.RunDir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	n.mounts = append(n.mounts, n.net.RunDir)
	if err := unix.Mount("", n.net.RunDir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(n.dir, "image")
	if err := os.MkdirAll(image, 0o755); err != nil {
		t.Fatal(err)
	}
	n.image = &containerImage{source: "cube-it-image-" + tag, dir: image, shim: runtimeBins.shim}
	n.extra = []string{"--pool-size", "1"}
	n.start()

	hostNS, _ := os.Readlink("/proc/self/ns/mnt")
	if ns, _ := os.Readlink("/proc/" + strconv.Itoa(n.proc.Process.Pid) + "/ns/mnt"); ns == hostNS {
		t.Fatal("cube up runs in the host mount namespace; the test proves nothing")
	}
	user, err := n.create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := n.run(ctx, user, "echo hi"); err != nil || strings.TrimSpace(out) != "hi" {
		t.Fatalf("run in sandbox: %q %v", out, err)
	}
	sups := n.waitSupervisors(t, 2) // the sandbox's and the pre-started slot's
	for name, info := range sups {
		proc := "/proc/" + strconv.Itoa(info.PID)
		if ns, _ := os.Readlink(proc + "/ns/mnt"); ns != hostNS {
			t.Errorf("%s: supervisor %d in mount namespace %s, want the host's %s", name, info.PID, ns, hostNS)
		}
		if exe, _ := os.Readlink(proc + "/exe"); exe != sup {
			t.Errorf("%s: supervisor runs %q, want the installer's %s", name, exe, sup)
		}
		if cwd, _ := os.Readlink(proc + "/cwd"); cwd != "/" {
			t.Errorf("%s: supervisor's cwd %q, want /", name, cwd)
		}
		if fileID(t, proc+"/root") != fileID(t, "/") {
			t.Errorf("%s: supervisor's root is not the host's /", name)
		}
		// With a user namespace pid 1 releases envd first and execs the
		// reaper right after: envd can answer (and the create return)
		// a moment before that exec.
		initExe := "/proc/" + strconv.Itoa(info.InitPID) + "/exe"
		deadline := time.Now().Add(5 * time.Second)
		for fileID(t, initExe) != fileID(t, reaper) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if fileID(t, initExe) != fileID(t, reaper) {
			t.Errorf("%s: sandbox init does not run the installer's cube-reaper", name)
		}
		if info.Version != oldVersion {
			t.Errorf("%s: supervisor version %q, want %s", name, info.Version, oldVersion)
		}
	}
	cubePid := n.proc.Process.Pid
	if h := holders(n.image.source); len(h) != 1 || h[0] != cubePid {
		t.Errorf("processes holding the container's image mount: %v, want only cube up (%d)", h, cubePid)
	}

	// The container goes away (the Pod is deleted): nothing pins its mounts.
	n.kill()
	deadline := time.Now().Add(10 * time.Second)
	for len(holders(n.image.source)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if h := holders(n.image.source); len(h) > 0 {
		t.Fatalf("after cube up is gone, processes %v still hold the container's image mount", h)
	}

	// The installer ships a new supervisor; the new container starts.
	install(t, runtimeBins.supNew, arts, "cube-supervisor")
	// Runtime names: the slot's, and the user sandbox's (made from another
	// slot, whose name its runtime keeps).
	var oldSlot, userRT string
	for name := range sups {
		if _, err := os.Stat(filepath.Join(n.dataDir(), "node", "pool", name+".img.json")); err == nil {
			oldSlot = name
		} else {
			userRT = name
		}
	}
	if oldSlot == "" || userRT == "" {
		t.Fatalf("cannot tell the pool slot from the sandbox among %v", sups)
	}
	n.start()
	if out, err := n.run(ctx, user, "echo again"); err != nil || strings.TrimSpace(out) != "again" {
		t.Fatalf("user sandbox after the upgrade: %q %v", out, err)
	}
	after := n.waitSupervisors(t, 2)
	if got := after[userRT]; got.PID != sups[userRT].PID || got.Version != oldVersion {
		t.Errorf("user sandbox's supervisor %+v, want the adopted %+v", got, sups[userRT])
	}
	if _, ok := after[oldSlot]; ok {
		t.Errorf("old pool slot %s survived the upgrade", oldSlot)
	}
	if err := syscall.Kill(sups[oldSlot].PID, 0); err == nil {
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(sups[oldSlot].PID) + "/stat"); !strings.Contains(string(b), ") Z") {
			t.Errorf("old pool slot's supervisor %d still runs", sups[oldSlot].PID)
		}
	}
	var newSlot string
	for name, info := range after {
		if name != userRT {
			newSlot = name
			if info.Version != newVersion {
				t.Errorf("new slot %s: supervisor version %q, want %s", name, info.Version, newVersion)
			}
		}
	}

	// doctor shows the versions and which sandbox runs an older runtime.
	out, _ := n.cubeCLI("node", "doctor", "--json")
	var doc struct {
		Runtime     *cubelet.RuntimeInfo       `json:"runtime"`
		Supervisors []cubelet.SupervisorStatus `json:"supervisors"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	if doc.Runtime == nil || doc.Runtime.MountNS == "" || doc.Runtime.Supervisor != sup || doc.Runtime.SupervisorFile == (cubelet.RuntimeInfo{}).SupervisorFile {
		t.Errorf("doctor runtime %+v", doc.Runtime)
	}
	current := map[string]bool{}
	for _, s := range doc.Supervisors {
		current[s.Owner] = s.Current
		if s.Owner == user.ID && (s.Version != oldVersion || s.Current) {
			t.Errorf("doctor: user sandbox %+v, want version %s from an earlier runtime", s, oldVersion)
		}
		if s.Owner == newSlot && (s.Version != newVersion || !s.Current) {
			t.Errorf("doctor: new slot %+v, want current version %s", s, newVersion)
		}
	}
	if len(doc.Supervisors) != 2 {
		t.Errorf("doctor: supervisors %+v, want the user sandbox's and the new slot's", doc.Supervisors)
	}
	text, _ := n.cubeCLI("node", "doctor")
	for _, want := range []string{"supervisors: 2 live (" + oldVersion + " x1, " + newVersion + " x1)", "earlier runtime: " + user.ID} {
		if !strings.Contains(text, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, text)
		}
	}
	t.Logf("doctor:\n%s", text)
	if sb, err := n.create(ctx); err != nil {
		t.Fatalf("create after the upgrade: %v", err)
	} else if out, err := n.run(ctx, sb, "echo fresh"); err != nil || strings.TrimSpace(out) != "fresh" {
		t.Fatalf("new sandbox: %q %v", out, err)
	}
}

// waitSupervisors waits until the node has want live supervisors (the pool
// refills in the background) and returns them.
func (n *node) waitSupervisors(t *testing.T, want int) map[string]supervisor.Info {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		live := map[string]supervisor.Info{}
		for name, info := range n.supervisors(t) {
			if syscall.Kill(info.PID, 0) == nil {
				if _, err := os.Stat(filepath.Join(n.dataDir(), "node", "sandboxes", name, supervisor.ExitFile)); err != nil {
					live[name] = info
				}
			}
		}
		if len(live) == want {
			return live
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live supervisors, want %d: %v\n%s", len(live), want, live, n.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
