package nsrt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
)

// TestMain lets the test binary play `cube shim`, `cube sandbox-init` and
// `cube supervise`.
// The tests themselves run in a child of a subreaper, which plays a reaping
// pid 1 for the detached shims (this machine's pid 1 does not reap).
func TestMain(m *testing.M) {
	if code, ok := Dispatch(os.Args[1:]); ok {
		os.Exit(code)
	}
	if len(os.Args) > 2 && os.Args[1] == "agent" {
		os.Exit(agentMain(os.Args[2]))
	}
	if os.Getenv(reapedEnv) == "" && os.Geteuid() == 0 {
		os.Exit(runUnderReaper())
	}
	os.Exit(m.Run())
}

const reapedEnv = "CUBE_NSRT_TEST_UNDER_REAPER"

// runUnderReaper re-runs the test binary as its child while reaping every
// orphan re-parented to it, and returns the child's exit code.
func runUnderReaper() int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "subreaper:", err)
		return 1
	}
	p, err := os.StartProcess("/proc/self/exe", os.Args, &os.ProcAttr{
		Env:   append(os.Environ(), reapedEnv+"=1"),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "re-exec tests:", err)
		return 1
	}
	code := 1
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return code
		}
		if pid == p.Pid {
			if ws.Exited() {
				code = ws.ExitStatus()
			}
			// Reap whatever has already exited, then leave.
			for {
				if pid, _ := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 {
					return code
				}
			}
		}
	}
}

// env is one test's world: a busybox template, a state dir, a unique cgroup
// parent, all removed in cleanup.
type env struct {
	exe      string
	rootfs   string
	stateDir string
	parent   string
	id       string
}

func randHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs /bin/busybox")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	e := &env{
		exe:      exe,
		rootfs:   filepath.Join(base, "template"),
		stateDir: filepath.Join(base, "state"),
		parent:   "cube-test-" + randHex(t),
		id:       "sb-" + randHex(t),
	}
	buildRootfs(t, e.rootfs)
	if err := os.Mkdir(e.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := Cleanup(ctx, e.stateDir, e.parent, e.id); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		for _, name := range []string{ShimCgroup(e.parent), e.parent} {
			if err := cgroup.DeleteEverywhere(ctx, name); err != nil {
				t.Errorf("delete cgroup %s: %v", name, err)
			}
		}
	})
	return e
}

// buildRootfs makes a tiny template: busybox with applet links, /etc/passwd.
func buildRootfs(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src, err := os.Open("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(dir, "bin", "busybox"), os.O_WRONLY|os.O_CREATE, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	for _, a := range []string{"sh", "sleep", "cat", "hostname", "ls", "echo", "grep", "mount", "ps", "touch", "rm", "wc", "true"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte("template\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (e *env) spec(args ...string) Spec {
	return Spec{
		ID: e.id, StateDir: e.stateDir, Rootfs: e.rootfs, Args: args,
		Env:          []string{"PATH=/bin", "HOME=/root"},
		Resources:    cgroup.Resources{CPUCount: 1, MemoryMB: 64, PidsMax: 64},
		CgroupParent: e.parent, ReadyTimeout: 5 * time.Second,
	}
}

// snapshot lists a tree's paths, sizes and modes (to prove it unchanged).
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p + " " + fi.Mode().String() + " " + strconv.FormatInt(fi.Size(), 10) + " " + fi.ModTime().String() + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// procStat returns ppid and session id of pid from /proc/<pid>/stat.
func procStat(t *testing.T, pid int) (state string, ppid, sid int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ppid, _ = strconv.Atoi(f[1])
	sid, _ = strconv.Atoi(f[3])
	return f[0], ppid, sid
}

// processesMentioning returns pids whose command line contains s.
func processesMentioning(t *testing.T, s string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), s) {
			if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && strings.Contains(string(st), ") Z ") {
				continue // a zombie waiting for pid 1 to reap it is gone already
			}
			out = append(out, pid)
		}
	}
	return out
}

func inode(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.FormatUint(fi.Sys().(*syscall.Stat_t).Ino, 10)
}

func newNetNS(t *testing.T) string {
	t.Helper()
	name := "cube-test-" + randHex(t)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del: %v: %s", err, out)
		}
	})
	return "/run/netns/" + name
}

// agentMain plays an agent: it starts the sandbox whose spec is in the JSON
// file, says "started" on stdout and blocks until it is SIGKILLed.
func agentMain(specFile string) int {
	b, err := os.ReadFile(specFile)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		fmt.Println(err)
		return 1
	}
	exe, _ := os.Executable()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := Start(ctx, exe, spec); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("started")
	select {}
}
