package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cgroup/control"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/supervisor"
)

// TestMain lets the test binary play `cube shim` with a fake workload, and
// the supervisor it execs.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == Command {
		os.Exit(Main(os.Args[2:], fakeLaunch))
	}
	if len(os.Args) > 1 && os.Args[1] == supervisor.Command {
		os.Exit(supervisor.Main(os.Args[2:]))
	}
	if sock := os.Getenv("CUBE_TEST_SILENT_SHIM"); sock != "" {
		os.Exit(silentShim(sock, os.Getenv("CUBE_TEST_SILENT_FOR")))
	}
	code := m.Run()
	// The fake workloads' cgroups are removed per test; their parent here.
	_ = cgroup.DeleteEverywhere(context.Background(), testCgroupParent)
	os.Exit(code)
}

// procWorkload is a plain child process in a cgroup of its own.
type procWorkload struct {
	cmd     *exec.Cmd
	cg      *cgroup.Cgroup
	badExec bool // Exec a path that does not exist
}

func (w *procWorkload) Pid() int              { return w.cmd.Process.Pid }
func (w *procWorkload) Cgroup() control.Group { return w.cg.Control() }
func (w *procWorkload) Kill(ctx context.Context) error {
	child, err := supervisor.OpenChild(w.Pid())
	if err != nil {
		return err
	}
	defer child.Close()
	if err := child.Kill(); err != nil {
		return err
	}
	return child.Wait(ctx)
}
func (w *procWorkload) Ready() supervisor.ReadyWait { return supervisor.ReadyWait{} }
func (w *procWorkload) Exec(path string, argv, env []string) error {
	if w.badExec {
		path = "/nonexistent/cube-supervisor"
	}
	return syscall.Exec(path, argv, env)
}

// testCgroupParent holds the fake workloads' cgroups.
const testCgroupParent = "cube-shimtest"

// fakeLaunch reads the workload's argv from stateDir/argv; "fail" fails,
// "badexec ARGV" starts ARGV and then fails to exec the supervisor.
func fakeLaunch(ctx context.Context, stateDir string) (Workload, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, "argv"))
	if err != nil {
		return nil, err
	}
	argv := strings.Fields(string(b))
	if argv[0] == "fail" {
		return nil, fmt.Errorf("launch refused: %w", errdefs.ErrInvalidArgument)
	}
	w := &procWorkload{badExec: argv[0] == "badexec"}
	if w.badExec {
		argv = argv[1:]
	}
	if w.cg, err = cgroup.Open(testCgroupParent, filepath.Base(stateDir)); err != nil {
		return nil, err
	}
	if err := w.cg.Create(cgroup.Resources{}); err != nil {
		return nil, err
	}
	w.cmd = exec.Command(argv[0], argv[1:]...)
	if err := w.cmd.Start(); err != nil {
		return nil, err
	}
	if err := w.cg.AddProc(w.Pid()); err != nil {
		_ = w.Kill(ctx)
		return nil, err
	}
	return w, nil
}

// needRoot skips t unless it runs as root: fakeLaunch puts the workload in
// a cgroup of its own.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the workload runs in a cgroup of its own")
	}
}

func setup(t *testing.T, argv string) (exe, dir string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "argv"), []byte(argv), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cg, err := cgroup.Open(testCgroupParent, filepath.Base(dir)); err == nil {
			_ = cg.Kill(context.Background())
			_ = cg.Remove(context.Background())
		}
	})
	return exe, dir
}

func TestSpawnKill(t *testing.T) {
	needRoot(t)
	exe, dir := setup(t, "/bin/busybox sleep 1000")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Spawn(ctx, exe, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Cleanup(func() { _ = c.Kill(context.Background()) })
	if c.Info().PID == os.Getpid() || c.Info().InitPID == 0 {
		t.Fatalf("info = %+v", c.Info())
	}
	// After the start the shim is the supervisor (same pid), with the
	// workload still its child.
	if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.Info().PID)); !strings.Contains(string(b), "\x00"+supervisor.Command+"\x00") {
		t.Errorf("shim command line %q: not the supervisor", b)
	}
	// The supervisor runs with one P; its workload does not inherit that.
	if env := procEnv(t, c.Info().PID); !slices.Contains(env, "GOMAXPROCS=1") {
		t.Errorf("shim environment lacks GOMAXPROCS=1: %q", env)
	}
	c2, err := Dial(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	st, err := c2.State(ctx)
	if err != nil || !st.Running || st.ShimPID != c.Info().PID || st.Version != supervisor.Version {
		t.Fatalf("State = %+v, %v", st, err)
	}
	if ds := c2.DialState(); !ds.Running || ds.ShimPID != st.ShimPID || ds.InitPID != st.InitPID {
		t.Fatalf("DialState = %+v, want the state Dial read (%+v)", ds, st)
	}
	if err := c2.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c2.Thaw(ctx); err != nil {
		t.Fatal(err)
	}
	watch, err := c2.ExitWatch()
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	if watch.Exited() {
		t.Fatal("ExitWatch: a running shim has exited")
	}
	if err := c2.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// Kill returns once the shim process is gone; the watch outlives c2.
	c2.Close()
	if !watch.Exited() {
		t.Error("ExitWatch: the killed shim has not exited")
	}
	if err := c.Kill(ctx); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	e, err := supervisor.ReadExit(dir)
	if err != nil || e.Signal != "SIGKILL" || e.Schema != supervisor.SchemaVersion {
		t.Errorf("exit record = %+v, %v", e, err)
	}
	if st, err := c.State(ctx); err != nil || st.Running {
		t.Errorf("State after exit = %+v, %v", st, err)
	}
	if err := c.Freeze(ctx); err == nil {
		t.Error("Freeze of an exited shim succeeded")
	}
	if _, err := Dial(ctx, dir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Dial after exit: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(dir, supervisor.SocketFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left: %v", err)
	}
}

func TestWorkloadExitEndsShim(t *testing.T) {
	needRoot(t)
	exe, dir := setup(t, "/bin/busybox false")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Spawn(ctx, exe, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := supervisor.ReadExit(dir); err != nil || e.ExitCode != 1 {
		t.Errorf("exit record = %+v, %v", e, err)
	}
}

func TestSpawnLaunchFailure(t *testing.T) {
	exe, dir := setup(t, "fail")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Spawn(ctx, exe, dir)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "launch refused") {
		t.Fatalf("err = %v, want the launcher's error and kind", err)
	}
	if _, err := supervisor.ReadInfo(dir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("shim.json written on failure: %v", err)
	}
}

// A shim that cannot exec its supervisor reports why and leaves nothing of
// its workload running.
func TestSpawnSupervisorExecFailure(t *testing.T) {
	needRoot(t)
	exe, dir := setup(t, "badexec /bin/busybox sleep 1000")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Spawn(ctx, exe, dir)
	if err == nil || !strings.Contains(err.Error(), "exec supervisor") {
		t.Fatalf("err = %v, want the failed exec", err)
	}
	cg, err := cgroup.Open(testCgroupParent, filepath.Base(dir))
	if err != nil {
		t.Fatal(err)
	}
	if procs, err := cg.Procs(); err != nil || len(procs) != 0 {
		t.Errorf("workload left running: %v, %v", procs, err)
	}
	if _, err := supervisor.ReadInfo(dir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("shim.json written on failure: %v", err)
	}
}

func TestSpawnBadExe(t *testing.T) {
	_, dir := setup(t, "x")
	if _, err := Spawn(context.Background(), "/nonexistent/cube", dir); err == nil {
		t.Fatal("Spawn of a missing binary succeeded")
	}
}

// TestKindOf: error kinds survive the trip through the shim API's HTTP
// statuses (the supervisor's records are tested in package supervisor).
func TestKindOf(t *testing.T) {
	for _, k := range []error{errdefs.ErrNotFound, errdefs.ErrUnavailable, errdefs.ErrFailedPrecondition, errdefs.ErrInvalidArgument} {
		if got := kindOf(errdefs.HTTPStatus(k)); got != k {
			t.Errorf("kindOf(%v) = %v", k, got)
		}
	}
}

// silentShim plays a shim that accepts connections but never answers, and
// exits after the duration given (or never, if none).
func silentShim(sock, lifetime string) int {
	l, err := net.Listen("unix", sock)
	if err != nil {
		return 1
	}
	go func() {
		var held []net.Conn
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	if d, err := time.ParseDuration(lifetime); err == nil {
		time.Sleep(d)
		return 0
	}
	select {}
}

// startSilentShim runs silentShim as a child and records it in a state dir.
func startSilentShim(t *testing.T, lifetime string) (dir string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	sock := filepath.Join(dir, supervisor.SocketFile)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "CUBE_TEST_SILENT_SHIM="+sock, "CUBE_TEST_SILENT_FOR="+lifetime)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	for range 200 {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	info := supervisor.Info{Schema: supervisor.SchemaVersion, PID: cmd.Process.Pid, Socket: sock, StartedAt: time.Now()}
	if err := atomicfile.WriteJSON(filepath.Join(dir, supervisor.InfoFile), info, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A shim that is exiting while Dial asks it (a SIGKILLed shim keeps its
// listener until its last thread is gone) is reported gone, not silent:
// before the fix the liveness check of a running cubelet took such a shim
// for an overloaded one and kept its dead sandbox.
func TestDialDyingShimIsNotFound(t *testing.T) {
	dir := startSilentShim(t, "150ms")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Dial(ctx, dir)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Dial of a dying shim: %v, want ErrNotFound", err)
	}
}

// A shim that lives but does not answer stays "unavailable": it proves
// nothing about its sandbox.
func TestDialSilentShimIsUnavailable(t *testing.T) {
	dir := startSilentShim(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, dir)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil {
		t.Fatalf("Dial of a silent live shim: %v, want a not-answering error", err)
	}
}

// procEnv reads the environment of pid.
func procEnv(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func TestSupervisorEnv(t *testing.T) {
	got := supervisorEnv([]string{"A=1", "GOMAXPROCS=8", "B=2"})
	if !slices.Equal(got, []string{"A=1", "B=2", "GOMAXPROCS=1"}) {
		t.Fatalf("supervisorEnv = %q", got)
	}
}

// TestReadReportsPrefersTheShimsError: a shim that fails its start reports
// and exits at once, so it may be gone when its hello is handled; the error
// it reported wins over "vanished" (TestSpawnLaunchFailure failed about one
// run in 300 before).
func TestReadReportsPrefersTheShimsError(t *testing.T) {
	gone := func(int) error { return errdefs.ErrNotFound }
	failed := `{"stage":"hello","pid":7}` + "\n" + `{"stage":"done","error":"launch refused","code":400}` + "\n"
	_, err := readReports(json.NewDecoder(strings.NewReader(failed)), gone)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "launch refused") {
		t.Fatalf("failed start, shim gone: %v, want the shim's error", err)
	}
	ok := `{"stage":"hello","pid":7}` + "\n" + `{"stage":"done","pid":7,"initPid":8}` + "\n"
	for name, in := range map[string]string{"reported success": ok, "no done report": `{"stage":"hello","pid":7}` + "\n"} {
		if _, err := readReports(json.NewDecoder(strings.NewReader(in)), gone); err == nil || !strings.Contains(err.Error(), "vanished") {
			t.Errorf("%s, shim gone: %v, want vanished", name, err)
		}
	}
	if res, err := readReports(json.NewDecoder(strings.NewReader(ok)), func(int) error { return nil }); err != nil || res.InitPID != 8 {
		t.Errorf("started: %+v, %v", res, err)
	}
}
