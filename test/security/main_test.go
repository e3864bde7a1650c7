// Package security holds the integration tests (root) of Cube's sandbox
// isolation: escapes that must fail and resource abuse that must stay inside
// one sandbox. Sandboxes run through nsrt.Start on a busybox template, with
// the probe helper (./probe, built static) bound in.
package security

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nsrt"
)

// probe is the static probe binary, built on first use by probeBinary.
var probe struct {
	once      sync.Once
	dir, path string
	err       error
}

// TestMain lets the test binary play `cube shim`, `cube sandbox-init` and
// `cube supervise`, and runs the tests under a reaping parent (the shims are
// detached and this machine's pid 1 does not reap).
func TestMain(m *testing.M) {
	if code, ok := nsrt.Dispatch(os.Args[1:]); ok {
		os.Exit(code)
	}
	if os.Getenv(reapedEnv) == "" {
		os.Exit(runUnderReaper())
	}
	code := m.Run()
	if probe.dir != "" {
		os.RemoveAll(probe.dir)
	}
	os.Exit(code)
}

// needRoot skips t unless it runs as root: sandboxes need namespaces,
// cgroups and mounts.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: starts sandboxes (namespaces, cgroups, mounts)")
	}
}

// probeBinary builds ./probe (static) on first use.
func probeBinary(t testing.TB) string {
	t.Helper()
	probe.once.Do(func() {
		dir, err := os.MkdirTemp("", "cube-probe-")
		if err != nil {
			probe.err = err
			return
		}
		probe.dir = dir
		path := filepath.Join(dir, "probe")
		build := exec.Command("go", "build", "-o", path, "./probe")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			probe.err = fmt.Errorf("build probe: %w: %s", err, out)
			return
		}
		probe.path = path
	})
	if probe.err != nil {
		t.Fatal(probe.err)
	}
	return probe.path
}

const reapedEnv = "CUBE_SECURITY_TEST_UNDER_REAPER"

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
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 1
		}
		if pid == p.Pid {
			code := 1
			if ws.Exited() {
				code = ws.ExitStatus()
			}
			for {
				if pid, _ := unix.Wait4(-1, &ws, unix.WNOHANG, nil); pid <= 0 {
					return code
				}
			}
		}
	}
}

func randHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// world is one test's busybox template, shared host dir and cgroup parent;
// every sandbox started through it is cleaned up with the test.
type world struct {
	t      *testing.T
	exe    string
	probe  string // the probe binary, bound at /bin/probe
	base   string
	rootfs string
	shared string // bound read-write on /shared in every sandbox
	parent string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	needRoot(t)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("needs /bin/busybox")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	w := &world{t: t, exe: exe, probe: probeBinary(t), base: base, rootfs: filepath.Join(base, "template"),
		shared: filepath.Join(base, "shared"), parent: "cube-sec-" + randHex(t)}
	buildRootfs(t, w.rootfs)
	if err := os.Mkdir(w.shared, 0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, name := range []string{nsrt.ShimCgroup(w.parent), w.parent} {
			if err := cgroup.DeleteEverywhere(ctx, name); err != nil {
				t.Errorf("delete cgroup %s: %v", name, err)
			}
		}
	})
	return w
}

func buildRootfs(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root", "mnt", "home/user"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "sleep", "cat", "echo", "id", "dd", "true", "ls", "ping"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"
	if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sandbox is a running test sandbox.
type sandbox struct {
	*nsrt.Sandbox
	id, stateDir string
}

// start runs script with /bin/sh as the sandbox's init (it must write to
// fd 3 when ready) with the given limits; cleanup kills and removes it.
func (w *world) start(ctx context.Context, script string, res cgroup.Resources, diskMB int) *sandbox {
	w.t.Helper()
	id := "sb-" + randHex(w.t)
	stateDir := filepath.Join(w.base, id)
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		w.t.Fatal(err)
	}
	spec := nsrt.Spec{
		ID: id, StateDir: stateDir, Rootfs: w.rootfs,
		Args: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/bin", "HOME=/root"},
		Binds: []nsrt.Bind{
			{Source: w.probe, Target: "/bin/probe", ReadOnly: true},
			{Source: w.shared, Target: "/shared"},
		},
		Resources: res, CgroupParent: w.parent, ReadyTimeout: 10 * time.Second, DiskSizeMB: diskMB,
	}
	w.t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := nsrt.Cleanup(cctx, stateDir, w.parent, id); err != nil {
			w.t.Errorf("cleanup %s: %v", id, err)
		}
	})
	sb, err := nsrt.Start(ctx, w.exe, spec)
	if err != nil {
		w.t.Fatalf("start sandbox: %v", err)
	}
	w.t.Cleanup(func() { sb.Close() })
	return &sandbox{Sandbox: sb, id: id, stateDir: stateDir}
}

// neighbour starts a sandbox that echoes on a unix socket in the shared dir
// and returns a function that checks it answers within a second.
func (w *world) neighbour(ctx context.Context) func() error {
	w.t.Helper()
	name := "n-" + randHex(w.t) + ".sock"
	w.start(ctx, "exec /bin/probe serve /shared/"+name, cgroup.Resources{CPUCount: 1, MemoryMB: 64, PidsMax: 32}, 0)
	sock := filepath.Join(w.shared, name)
	return func() error {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return fmt.Errorf("dial neighbour: %w", err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("hi\n")); err != nil {
			return fmt.Errorf("write neighbour: %w", err)
		}
		b := make([]byte, 3)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "hi\n" {
			return fmt.Errorf("neighbour answered %q, %v", b, err)
		}
		return nil
	}
}

// cgroupOf opens a sandbox's cgroup.
func (w *world) cgroupOf(sb *sandbox) *cgroup.Cgroup {
	w.t.Helper()
	cg, err := cgroup.Open(w.parent, sb.id)
	if err != nil {
		w.t.Fatal(err)
	}
	return cg
}

// readShared reads a file the sandbox wrote to /shared.
func (w *world) readShared(name string) string {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.shared, name))
	if err != nil {
		w.t.Fatal(err)
	}
	return string(b)
}

// results parses "key=value" lines.
func results(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// hostResponsive checks that the host can still fork and exec promptly.
func hostResponsive(t *testing.T) {
	t.Helper()
	start := time.Now()
	if err := exec.Command("/bin/true").Run(); err != nil {
		t.Errorf("host cannot run /bin/true: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("host took %s to run /bin/true", d)
	}
}

// eventually polls cond every 20 ms until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}
