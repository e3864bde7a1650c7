package envd_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
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

	"connectrpc.com/connect"

	"github.com/cube-dev/cube/api/gen/envd/process/processconnect"
	"github.com/cube-dev/cube/internal/envd"
	"github.com/cube-dev/cube/internal/nativebin"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	base := runtime.NumGoroutine()
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 && !goroutinesSettle(base) {
		code = 1
	}
	os.Exit(code)
}

// goroutinesSettle waits until no more goroutines run than before the
// tests (plus slack for runtime helpers), printing them when some leak.
func goroutinesSettle(base int) bool {
	http.DefaultClient.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if runtime.NumGoroutine() <= base+2 {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	fmt.Fprintf(os.Stderr, "goroutine leak: %d running, %d before tests\n%s\n", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
	return false
}

// envdBinary builds cmd/envd (and the C cube-reaper next to it) statically,
// once per test run.
func envdBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "envd-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "envd")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binPath, "github.com/cube-dev/cube/cmd/envd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build envd: %v: %s", err, out)
			return
		}
		binErr = nativebin.Build(ctx, "cube-reaper", filepath.Join(binDir, "cube-reaper"))
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// runBinaryUnder starts envd with a config under wrapper (argv before
// envd's own, e.g. cube-reaper ... --) and waits for its ready byte.
func runBinaryUnder(t *testing.T, cfg string, attr *syscall.SysProcAttr, wrapper []string) (*exec.Cmd, string, *exitState) {
	t.Helper()
	return runBinaryWith(t, cfg, attr, wrapper, nil)
}

// runBinaryWith is runBinaryUnder with env added to the environment.
func runBinaryWith(t *testing.T, cfg string, attr *syscall.SysProcAttr, wrapper, env []string) (*exec.Cmd, string, *exitState) {
	t.Helper()
	bin := envdBinary(t)
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "envd.json")
	writeFile(t, cfgFile, cfg)
	addr := freeAddr(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	argv := append(append([]string{}, wrapper...), bin, "--addr", addr, "--config", cfgFile, "--ready-fd", "3")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = attr
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := &exitState{done: make(chan struct{})}
	go func() {
		exited.err = cmd.Wait()
		close(exited.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-exited.done:
		case <-time.After(10 * time.Second):
			t.Errorf("envd %d did not exit", cmd.Process.Pid)
		}
	})
	r.SetReadDeadline(time.Now().Add(15 * time.Second))
	buf := make([]byte, 8)
	n, err := r.Read(buf)
	if err != nil || n != 1 {
		t.Fatalf("ready fd: n=%d err=%v", n, err)
	}
	return cmd, "http://" + addr, exited
}

// exitState is the outcome of cmd.Wait, valid once done is closed.
type exitState struct {
	done chan struct{}
	err  error
}

func stopBinary(t *testing.T, cmd *exec.Cmd, exited *exitState) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited.done:
		if exited.err != nil {
			t.Fatalf("envd exited with %v", exited.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("envd did not stop on SIGTERM")
	}
}

// stopPID1 sends SIGTERM to a pid 1 and checks that it ends, and its pid
// namespace with it. The reaper catches no signal (it would cost two
// threads per sandbox), so envd is not asked first: the runtime's default
// action ends pid 1 and the kernel kills the rest of the namespace.
func stopPID1(t *testing.T, cmd *exec.Cmd, exited *exitState, ns string) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited.done:
	case <-time.After(10 * time.Second):
		t.Fatal("pid 1 did not end on SIGTERM")
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(processesIn(t, ns)) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("processes of the pid namespace outlived its pid 1")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBinary(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	out, err := exec.Command(envdBinary(t), "--version").Output()
	if err != nil || strings.TrimSpace(string(out)) != envd.Version {
		t.Fatalf("--version: %q %v", out, err)
	}
	if err := exec.Command(envdBinary(t), "--bogus").Run(); err == nil {
		t.Fatal("unknown flag accepted")
	}
	// Started like a node starts it: on one P until it has served
	// (StartupProcsEnv); nothing it starts sees those variables.
	cmd, url, exited := runBinaryWith(t, `{"accessToken":"bin-token","defaultUser":"root","envVars":{"X":"y"}}`, nil, nil, envd.StartupProcsEnv)
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health %d", resp.StatusCode)
	}
	// Once serving, envd unmaps the start-up pages of its binary: its file
	// RSS falls, and everything below runs on pages faulted back in.
	started := rssFileKiB(t, cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for rssFileKiB(t, cmd.Process.Pid) > started/2 {
		if time.Now().After(deadline) {
			t.Fatalf("envd's file RSS stayed at %d KiB (started at %d)", rssFileKiB(t, cmd.Process.Pid), started)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("envd RssFile %d -> %d KiB", started, rssFileKiB(t, cmd.Process.Pid))
	ctx := testCtx(t, 20*time.Second)
	pc := processconnect.NewProcessClient(http.DefaultClient, url, connect.WithProtoJSON(), connect.WithInterceptors(tokenInterceptor("bin-token")))
	s, err := pc.Start(ctx, connect.NewRequest(startCmd(`echo "$X${GOMAXPROCS-}${CUBE_ENVD_STARTUP_PROCS-}"; exit 4`)))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	if string(r.stdout) != "y\n" || r.end.GetExitCode() != 4 {
		t.Fatalf("stdout %q end %v", r.stdout, r.end)
	}
	stopBinary(t, cmd, exited)
}

// TestBinaryAsPID1 runs envd as PID 1 of a new pid namespace: orphans of
// commands must be reaped, exit codes of commands must still be reported.
func TestBinaryAsPID1(t *testing.T) {
	t.Parallel()
	t.Run("envd", func(t *testing.T) { testPID1(t, nil) })
	// cube-reaper as pid 1 starting envd, as cubelet runs sandboxes.
	t.Run("cube-reaper", func(t *testing.T) {
		reaper := filepath.Join(filepath.Dir(envdBinary(t)), "cube-reaper")
		testPID1(t, []string{reaper, "--inherit-fd", "3", "--"})
	})
}

func testPID1(t *testing.T, wrapper []string) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for CLONE_NEWPID")
	}
	cmd, url, exited := runBinaryUnder(t, `{"defaultUser":"root"}`, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}, wrapper)
	reaperPid := cmd.Process.Pid
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", reaperPid))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 20*time.Second)
	pc := processconnect.NewProcessClient(http.DefaultClient, url, connect.WithProtoJSON())
	s, err := pc.Start(ctx, connect.NewRequest(startCmd(`sleep 1 >/dev/null 2>&1 & echo $!; exit 5`)))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	if r.end.GetExitCode() != 5 {
		t.Fatalf("end %v (exec.Cmd.Wait broken under the reaper?)", r.end)
	}
	nsPid := strings.TrimSpace(string(r.stdout))
	orphan := findByNSPid(t, ns, nsPid)
	if orphan == 0 {
		t.Fatalf("orphan (ns pid %s) not found", nsPid)
	}
	if ppid := statusField(orphan, "PPid"); ppid != strconv.Itoa(reaperPid) {
		t.Errorf("orphan's parent is %s, want the reaper %d", ppid, reaperPid)
	}
	// A zombie would stay in /proc forever; a reaped orphan disappears.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", orphan)); os.IsNotExist(err) {
			stopPID1(t, cmd, exited, ns)
			return
		}
		time.Sleep(20 * time.Millisecond) // no notification for another parent's child exiting
	}
	t.Fatalf("orphan %d not reaped: state %s", orphan, statusField(orphan, "State"))
}

// findByNSPid finds the host pid of the process whose innermost pid in
// namespace ns is nsPid.
func findByNSPid(t *testing.T, ns, nsPid string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || l != ns {
			continue
		}
		f := strings.Fields(statusField(pid, "NSpid"))
		if len(f) > 0 && f[len(f)-1] == nsPid {
			return pid
		}
	}
	return 0
}

// processesIn returns the host pids of the processes in pid namespace ns.
func processesIn(t *testing.T, ns string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err == nil && l == ns {
			out = append(out, pid)
		}
	}
	return out
}

func statusField(pid int, key string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// rssFileKiB is the RssFile line of /proc/<pid>/status.
func rssFileKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	t.Fatalf("no RssFile in /proc/%d/status", pid)
	return 0
}
