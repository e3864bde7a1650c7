package nsrt

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cgroup/control"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/supervisor"
)

// readyScript records what the sandbox sees into /tmp (read from the host
// through /proc/<init>/root), signals readiness and becomes a sleeper.
const readyScript = `hostname > /tmp/hostname; echo $$ > /tmp/pid; ls /proc | grep -c '^[0-9]*$' > /tmp/nprocs;
cat /proc/mounts > /tmp/mounts; echo hello > /etc/written; rm -f /etc/passwd;
echo x >&3; exec sleep 1000`

func TestSandboxLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	netns := newNetNS(t)
	hostDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(hostDir, "data"), []byte("from host"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, e.rootfs)

	spec := e.spec("/bin/sh", "-c", readyScript)
	spec.NetNSPath = netns
	spec.Files = map[string]FileSpec{
		"/etc/hostname":    {Data: []byte(e.id + "\n")},
		"/.cube/envd.json": {Data: []byte(`{"token":"t"}`), Mode: 0o600},
		"/etc/resolv.conf": {Data: []byte("nameserver 10.0.0.1\n")},
	}
	spec.Binds = []Bind{{Source: hostDir, Target: "/mnt/host", ReadOnly: true}}
	sb, err := Start(ctx, e.exe, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	init := sb.InitPID()
	root := "/proc/" + strconv.Itoa(init) + "/root"
	read := rootReader(t, root)

	if got := read("/tmp/hostname"); got != e.id {
		t.Errorf("hostname inside = %q, want %q", got, e.id)
	}
	if got := read("/tmp/pid"); got != "1" {
		t.Errorf("init's pid inside = %s, want 1", got)
	}
	assertNoGOMAXPROCS(t, init)
	if n, _ := strconv.Atoi(read("/tmp/nprocs")); n < 1 || n > 3 {
		t.Errorf("sandbox /proc shows %d processes; it is not its own procfs", n)
	}
	if got := read("/mnt/host/data"); got != "from host" {
		t.Errorf("bind content = %q", got)
	}
	if err := os.WriteFile(root+"/mnt/host/new", nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write into read-only bind: %v, want EROFS", err)
	}
	if got := read("/.cube/envd.json"); got != `{"token":"t"}` {
		t.Errorf("envd.json = %q", got)
	}
	if fi, err := os.Stat(root + "/.cube/envd.json"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("envd.json mode: %v, %v", fi, err)
	}
	for _, m := range []string{" /proc proc ", " /sys sysfs ro,", " /dev tmpfs ", " /dev/pts devpts ", " /dev/shm tmpfs "} {
		if !strings.Contains(read("/tmp/mounts"), m) {
			t.Errorf("sandbox mounts lack %q:\n%s", m, read("/tmp/mounts"))
		}
	}
	if fi, err := os.Stat(root + "/dev/null"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("/dev/null in sandbox: %v, %v", fi, err)
	}
	// Masked directories are empty, read-only, and share one tmpfs.
	var masks []uint64
	for _, d := range []string{"/proc/acpi", "/sys/firmware"} {
		fi, err := os.Stat(root + d)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if ents, _ := os.ReadDir(root + d); len(ents) != 0 {
			t.Errorf("masked %s shows %d entries", d, len(ents))
		}
		if err := os.WriteFile(root+d+"/x", nil, 0o644); !errors.Is(err, syscall.EROFS) {
			t.Errorf("write into masked %s: %v, want EROFS", d, err)
		}
		masks = append(masks, fi.Sys().(*syscall.Stat_t).Dev)
	}
	if len(masks) == 2 && masks[0] != masks[1] {
		t.Errorf("masked directories on devices %v: want one tmpfs for all", masks)
	}
	// Network namespace joined.
	if got, want := inode(t, "/proc/"+strconv.Itoa(init)+"/ns/net"), inode(t, netns); got != want {
		t.Errorf("init netns inode %s, want %s", got, want)
	}
	// The overlay exists only in the sandbox's mount namespace.
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), e.stateDir) {
		t.Errorf("host mountinfo mentions the state dir:\n%s", mi)
	}
	// The template is untouched even though the sandbox wrote and deleted.
	if got := read("/etc/written"); got != "hello" {
		t.Errorf("sandbox write lost: %q", got)
	}
	if after := snapshot(t, e.rootfs); after != before {
		t.Errorf("template changed:\nbefore %s\nafter %s", before, after)
	}

	// Cgroup limits and membership.
	cg, err := cgroup.Open(e.parent, e.id)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := cg.Procs()
	if err != nil || !slices.Contains(procs, init) {
		t.Errorf("sandbox cgroup procs = %v, %v; want init %d", procs, err, init)
	}
	st, err := cg.Stats()
	if err != nil || st.MemLimit != 64<<20 {
		t.Errorf("stats = %+v, %v; want 64MiB limit", st, err)
	}
	if b, _ := os.ReadFile(filepath.Join(cg.Dir("pids"), "pids.max")); strings.TrimSpace(string(b)) != "64" {
		t.Errorf("pids.max = %q", b)
	}

	// The shim is detached: it leads its own session and lives in the shims
	// cgroup (it is the agent's child until the agent exits; the restart
	// tests cover the agent going away).
	shimPID := sb.ShimPID()
	_, _, sid := procStat(t, shimPID)
	if sid != shimPID {
		t.Errorf("shim session = %d, want %d", sid, shimPID)
	}
	// Every hierarchy: the thread that forked the init into the sandbox
	// cgroup went back before it exec'd the supervisor (a supervisor in
	// the sandbox's cgroup would be frozen and killed with it).
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(shimPID) + "/cgroup")
	for line := range strings.Lines(string(b)) {
		if parts := strings.SplitN(strings.TrimSpace(line), ":", 3); len(parts) != 3 || parts[2] != "/"+ShimCgroup(e.parent) {
			t.Errorf("shim cgroups:\n%s", b)
			break
		}
	}
	// Once the sandbox was ready the shim exec'd the supervisor: same pid,
	// the init still its child, and no longer in the sandbox's network
	// namespace, which the thread that started the init had joined.
	if b, _ := os.ReadFile("/proc/" + strconv.Itoa(shimPID) + "/cmdline"); !strings.Contains(string(b), "\x00"+supervisor.Command+"\x00") {
		t.Errorf("shim command line %q: not the supervisor", b)
	}
	if _, ppid, _ := procStat(t, init); ppid != shimPID {
		t.Errorf("init's parent = %d, want the shim %d", ppid, shimPID)
	}
	if got, want := inode(t, "/proc/"+strconv.Itoa(shimPID)+"/ns/net"), inode(t, "/proc/self/ns/net"); got != want {
		t.Errorf("shim netns inode %s, want the host's %s", got, want)
	}

	// An agent restart: a fresh handle from the state dir only.
	sb2, err := Attach(ctx, e.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer sb2.Close()
	state, err := sb2.State(ctx)
	if err != nil || !state.Running || state.InitPID != init || state.ShimPID != shimPID || state.Version == "" {
		t.Fatalf("State = %+v, %v", state, err)
	}
	if _, err := Start(ctx, e.exe, spec); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Start: %v, want ErrAlreadyExists", err)
	}

	if err := sb2.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if state, _ := sb2.State(ctx); !state.Frozen {
		t.Errorf("not frozen: %+v", state)
	}
	if err := sb2.Thaw(ctx); err != nil {
		t.Fatal(err)
	}

	if err := sb2.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	state, err = sb.State(ctx)
	if err != nil || state.Running || state.Signal != "SIGKILL" {
		t.Errorf("State after Kill = %+v, %v", state, err)
	}
	if procs, _ := cg.Procs(); len(procs) != 0 {
		t.Errorf("processes left after Kill: %v", procs)
	}
	if left := processesMentioning(t, e.stateDir); len(left) != 0 {
		t.Errorf("processes left after Kill: %v", left)
	}
	if _, err := Attach(ctx, e.stateDir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Attach after Kill: %v, want ErrNotFound", err)
	}

	if err := Cleanup(ctx, e.stateDir, e.parent, e.id); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(ctx, e.stateDir, e.parent, e.id); err != nil {
		t.Fatalf("second Cleanup: %v", err)
	}
	if ids, err := cgroup.List(e.parent); err != nil || len(ids) != 0 {
		t.Errorf("cgroups left: %v, %v", ids, err)
	}
	if _, err := os.Stat(e.stateDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state dir left: %v", err)
	}
}

// assertNothingLeft checks a failed Start undid everything.
func assertNothingLeft(t *testing.T, e *env) {
	t.Helper()
	if ents, _ := os.ReadDir(e.stateDir); len(ents) != 0 {
		var names []string
		for _, en := range ents {
			names = append(names, en.Name())
		}
		t.Errorf("state dir not emptied: %v", names)
	}
	if ids, err := cgroup.List(e.parent); err != nil || len(ids) != 0 {
		t.Errorf("cgroups left: %v, %v", ids, err)
	}
	if left := processesMentioning(t, e.stateDir); len(left) != 0 {
		t.Errorf("processes left: %v", left)
	}
}

func TestStartFailures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		args     []string
		timeout  time.Duration
		netns    string
		kind     error
		contains []string
	}{
		{"init exits early", []string{"/bin/sh", "-c", "echo boom-before-ready; exit 3"}, 0, "",
			errdefs.ErrFailedPrecondition, []string{"exit code 3", "boom-before-ready"}},
		{"never ready", []string{"/bin/sh", "-c", "echo waiting-forever; exec sleep 1000"}, 300 * time.Millisecond, "",
			errdefs.ErrUnavailable, []string{"not ready after 300ms", "waiting-forever"}},
		{"missing command", []string{"no-such-cmd"}, 0, "",
			errdefs.ErrFailedPrecondition, []string{`"no-such-cmd" not found`}},
		{"missing netns", []string{"/bin/true"}, 0, "/run/netns/cube-test-does-not-exist",
			errdefs.ErrNotFound, []string{"open netns"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := e.spec(c.args...)
			spec.ReadyTimeout = c.timeout
			spec.NetNSPath = c.netns
			sb, err := Start(ctx, e.exe, spec)
			if err == nil {
				sb.Kill(ctx)
				sb.Close()
				t.Fatal("Start succeeded")
			}
			if !errors.Is(err, c.kind) {
				t.Errorf("err = %v, want kind %v", err, c.kind)
			}
			for _, s := range c.contains {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v, want it to mention %q", err, s)
				}
			}
			assertNothingLeft(t, e)
		})
	}
}

func TestForkBombContained(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The bomb runs in a child so that init survives the failing forks.
	spec := e.spec("/bin/sh", "-c", "echo x >&3; (while :; do sleep 1000 & done) & exec sleep 1000")
	spec.Resources.PidsMax = 32
	sb, err := Start(ctx, e.exe, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	cg, err := cgroup.Open(e.parent, e.id)
	if err != nil {
		t.Fatal(err)
	}
	// pids.events counts refused forks: the bomb hit the ceiling.
	for {
		b, err := os.ReadFile(filepath.Join(cg.Dir("pids"), "pids.events"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "max 0") {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("fork bomb never reached pids.max")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if st, err := cg.Stats(); err != nil || st.Pids > 32 {
		t.Errorf("stats = %+v, %v; want at most 32 pids", st, err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if procs, _ := cg.Procs(); len(procs) != 0 {
		t.Errorf("processes left: %v", procs)
	}
}

func TestNewNetNSWhenNoPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := Start(ctx, e.exe, e.spec("/bin/sh", "-c", "echo x >&3; exec sleep 1000"))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if inode(t, "/proc/"+strconv.Itoa(sb.InitPID())+"/ns/net") == inode(t, "/proc/self/ns/net") {
		t.Error("sandbox shares the host netns")
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
}

// SIGTERM to a shim ends its sandbox: the supervisor does not catch it
// (a caught signal costs every sandbox two threads), and the init's
// parent-death signal takes the pid namespace with it. Nothing of the
// sandbox's may keep running without a supervisor.
func TestShimSIGTERMEndsSandbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb, err := Start(ctx, e.exe, e.spec("/bin/sh", "-c", "echo x >&3; sleep 1000 & exec sleep 1000"))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := syscall.Kill(sb.ShimPID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := sb.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	cg, err := cgroup.Open(e.parent, e.id)
	if err != nil {
		t.Fatal(err)
	}
	if err := control.PollUntil(ctx, func() (bool, error) {
		procs, err := cg.Procs()
		return err == nil && len(procs) == 0, err
	}); err != nil {
		t.Errorf("sandbox processes left after SIGTERM to the shim: %v", err)
	}
	if err := Cleanup(ctx, e.stateDir, e.parent, e.id); err != nil {
		t.Fatal(err)
	}
}

func TestSpecValidate(t *testing.T) {
	dir := t.TempDir()
	ok := Spec{ID: "a", StateDir: dir, Rootfs: dir, Args: []string{"/x"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
	cases := map[string]func(*Spec){
		"empty id":      func(s *Spec) { s.ID = "" },
		"slash id":      func(s *Spec) { s.ID = "a/b" },
		"relative root": func(s *Spec) { s.Rootfs = "rel" },
		"comma rootfs":  func(s *Spec) { s.Rootfs = "/a,b" },
		"missing dir":   func(s *Spec) { s.StateDir = "/nonexistent/x" },
		"no args":       func(s *Spec) { s.Args = nil },
		"rel netns":     func(s *Spec) { s.NetNSPath = "netns" },
		"rel bind":      func(s *Spec) { s.Binds = []Bind{{Source: dir, Target: "x"}} },
		"missing bind":  func(s *Spec) { s.Binds = []Bind{{Source: "/nonexistent", Target: "/x"}} },
		"root file":     func(s *Spec) { s.Files = map[string]FileSpec{"/": {}} },
		"rel file":      func(s *Spec) { s.Files = map[string]FileSpec{"etc/x": {}} },
		"neg memory":    func(s *Spec) { s.Resources.MemoryMB = -1 },
		"long hostname": func(s *Spec) { s.Hostname = strings.Repeat("h", 65) },
	}
	for name, mutate := range cases {
		s := ok
		mutate(&s)
		if err := s.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestAttachMissing(t *testing.T) {
	ctx := context.Background()
	if _, err := Attach(ctx, t.TempDir()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Attach on empty dir: %v, want ErrNotFound", err)
	}
}

// TestSandboxOutlivesAgent starts a sandbox from an agent process, SIGKILLs
// the agent, and re-attaches from here.
func TestSandboxOutlivesAgent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, _ := json.Marshal(e.spec("/bin/sh", "-c", "echo x >&3; exec sleep 1000"))
	specFile := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(specFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	agent := exec.CommandContext(ctx, e.exe, "agent", specFile)
	out, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	_ = agent.Process.Kill()
	_ = agent.Wait()
	if strings.TrimSpace(line) != "started" {
		t.Fatalf("agent: %q", line)
	}
	sb, err := Attach(ctx, e.stateDir)
	if err != nil {
		t.Fatalf("Attach after the agent died: %v", err)
	}
	defer sb.Close()
	if st, err := sb.State(ctx); err != nil || !st.Running {
		t.Fatalf("State = %+v, %v", st, err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
}

func FuzzReadSpec(f *testing.F) {
	f.Add([]byte(`{"id":"a","stateDir":"/x","rootfs":"/y","args":["/z"],"files":{"/f":{"data":"aGk=","mode":420}}}`))
	f.Add([]byte(`{"resources":{"CPUCount":-1}}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, SpecFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if s, err := readSpec(dir); err == nil {
			_ = s.withDefaults().Validate()
		}
	})
}

// rootReader returns a reader of trimmed files under root (a sandbox's
// /proc/PID/root) that fails t on error.
func rootReader(t *testing.T, root string) func(string) string {
	return func(p string) string {
		t.Helper()
		b, err := os.ReadFile(root + p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
}
