package security

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/seccomp"
)

//go:embed testdata/workloads.sh
var workloadsScript []byte

// workloadTools are what testdata/workloads.sh runs, from the host's /usr
// (hack/deps.sh installs them: gcc libc6-dev git python3-pip
// python3-ipykernel python3-numpy; node comes with the e2e suite's
// Node.js).
var workloadTools = []string{"/usr/bin/python3", "/usr/bin/gcc", "/usr/bin/git", "/usr/bin/dpkg-deb", "/usr/bin/apt-get", "/usr/bin/bash"}

// needWorkloadTools skips (fails under CI) when a tool is missing.
func needWorkloadTools(t *testing.T) (node string) {
	t.Helper()
	missing := func(what string) {
		msg := fmt.Sprintf("needs %s on the host (run `make deps`)", what)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	for _, p := range workloadTools {
		if _, err := os.Stat(p); err != nil {
			missing(p)
		}
	}
	if out, err := exec.Command("/usr/bin/python3", "-c", "import numpy, ipykernel, jupyter_client, pip").CombinedOutput(); err != nil {
		missing("python3-numpy, python3-ipykernel and python3-pip: " + strings.TrimSpace(string(out)))
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node (Node.js, as for the e2e suite)")
	}
	if node, err = filepath.EvalSymlinks(node); err != nil {
		missing("node: " + err.Error())
	}
	return node
}

// hostTemplate makes a template whose /usr and /etc are the host's, bound
// read-only: the workloads' binaries are the host's, the sandbox's writes
// (dpkg's database, pip's user site, /opt) land in its own layer. It costs
// nothing to build, unlike a debootstrap with a compiler, git and Node.js.
func hostTemplate(t *testing.T, dir string) []nsrt.Bind {
	t.Helper()
	for _, d := range []string{"etc", "usr", "tmp", "var/tmp", "proc", "sys", "dev", "root", "run", "opt",
		"home/user", "var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers",
		"var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/log/apt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"tmp", "var/tmp"} {
		if err := os.Chmod(filepath.Join(dir, d), 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	// Merged /usr, as on Debian 12: /bin, /lib, ... are links into /usr.
	for _, l := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		if target, err := os.Readlink("/" + l); err == nil {
			if err := os.Symlink(target, filepath.Join(dir, l)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An empty dpkg database: the sandbox installs into its own.
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return []nsrt.Bind{{Source: "/usr", Target: "/usr", ReadOnly: true}, {Source: "/etc", Target: "/etc", ReadOnly: true}}
}

// loopbackNetNS makes a network namespace whose loopback is up (the
// workloads talk over 127.0.0.1; nothing else is reachable).
func loopbackNetNS(t *testing.T) string {
	t.Helper()
	name := "cube-sec-" + randHex(t)
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return "/run/netns/" + name
}

// TestWorkloadsUnderAllowlist runs what agents run in sandboxes (python3
// with multiprocessing, asyncio and numpy; node; bash and coreutils; dpkg
// -i and apt-get install of a local .deb; pip install of a local wheel;
// gcc compiling and running a C program; git on a local repository; a
// Jupyter kernel executing numpy code), offline, as root inside a sandbox
// under the seccomp allowlist in log mode. Refused syscalls the kernel
// logged for the sandbox are listed: they are what a workload tried and
// fell back from (or failed on).
//
// It runs twice: with root inside being host root, and in a user
// namespace (the default where the kernel allows it; skipped elsewhere).
func TestWorkloadsUnderAllowlist(t *testing.T) {
	node := needWorkloadTools(t)
	if os.Getenv("CUBE_WORKLOADS") != "" {
		workloadsTimeout = time.Minute
	}
	t.Run("hostuser", func(t *testing.T) { runWorkloads(t, node, false) })
	t.Run("userns", func(t *testing.T) { runWorkloads(t, node, true) })
}

func runWorkloads(t *testing.T, node string, userns bool) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	refused := watchRefused(t, ctx, w.parent)
	rootfs := filepath.Join(w.base, "hosttemplate")
	binds := hostTemplate(t, rootfs)
	binds = append(binds,
		nsrt.Bind{Source: node, Target: "/opt/cube-node/node", ReadOnly: true},
		nsrt.Bind{Source: w.probe, Target: "/opt/cube-probe/probe", ReadOnly: true},
		nsrt.Bind{Source: w.shared, Target: "/shared"})
	if err := os.WriteFile(filepath.Join(w.shared, "workloads.sh"), workloadsScript, 0o755); err != nil {
		t.Fatal(err)
	}
	// Root inside a user namespace is not the host root owning it.
	if err := os.Chmod(w.shared, 0o777); err != nil {
		t.Fatal(err)
	}
	id := "sb-" + randHex(t)
	stateDir := filepath.Join(w.base, id)
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var u *nsrt.UserNS
	if userns {
		if err := nsrt.ProbeUserNS(rootfs, stateDir); err != nil {
			t.Skipf("no user namespace here: %v", err)
		}
		u = nsrt.UserNSForSlot(11)
	}
	spec := nsrt.Spec{UserNS: u,
		ID: id, StateDir: stateDir, Rootfs: rootfs, NetNSPath: loopbackNetNS(t),
		Args: []string{"/bin/sh", "-c", "echo x >&3; /bin/bash /shared/workloads.sh /tmp/w > /shared/out 2>&1; exec sleep 1000"},
		// CUBE_WORKLOADS="python git" runs only those (debugging).
		Env: []string{"PATH=/usr/bin:/bin", "CUBE_WORKLOADS=" + os.Getenv("CUBE_WORKLOADS")}, Binds: binds,
		Resources:    cgroup.Resources{CPUCount: 2, MemoryMB: 1024, PidsMax: 512},
		CgroupParent: w.parent, ReadyTimeout: 10 * time.Second,
		Seccomp: &nsrt.Seccomp{Log: true},
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := nsrt.Cleanup(cctx, stateDir, w.parent, id); err != nil {
			t.Errorf("cleanup %s: %v", id, err)
		}
	})
	start := time.Now()
	sb, err := nsrt.Start(ctx, w.exe, spec)
	if err != nil {
		t.Fatalf("start sandbox: %v", err)
	}
	t.Cleanup(func() { sb.Close() })
	out := filepath.Join(w.shared, "out")
	if !eventually(workloadsTimeout, func() bool {
		b, _ := os.ReadFile(out)
		return strings.Contains(string(b), "done=ok")
	}) {
		b, _ := os.ReadFile(out)
		initLog, _ := os.ReadFile(filepath.Join(stateDir, nsrt.InitLog))
		t.Fatalf("workloads did not finish in %s; output so far:\n%s\ninit log:\n%s", workloadsTimeout, b, initLog)
	}
	t.Logf("workloads ran in %s", time.Since(start).Round(time.Millisecond))
	text := w.readShared("out")
	got := results(text)
	names := []string{"bash_coreutils", "python", "node", "dpkg", "pip_wheel", "gcc", "git", "jupyter"}
	if only := os.Getenv("CUBE_WORKLOADS"); only != "" {
		names = strings.Fields(only)
	}
	for _, name := range names {
		if got[name] != "ok" {
			t.Errorf("%s = %q, want ok", name, got[name])
		}
	}
	calls := refused.calls(id)
	t.Logf("refused syscalls the kernel logged for the sandbox: %v", calls)
	if got["kcmp"] != "EPERM" {
		t.Errorf("probe refuse: kcmp = %q, want EPERM", got["kcmp"])
	}
	// The log must attribute the probe's kcmp to the sandbox, by pid
	// through its cgroup.
	if calls["probe:kcmp"] == 0 {
		t.Errorf("the seccomp log attributed no kcmp to sandbox %s: %v (the kernel rate-limits these records host-wide: did something flood it?)", id, calls)
	}
	if t.Failed() {
		t.Logf("workloads output:\n%s", text)
	}
}

// refusedLog collects the seccomp log's records per sandbox.
type refusedLog struct {
	mu  sync.Mutex
	by  map[string]map[string]int // sandbox -> "comm:syscall" -> count
	err error
}

// watchRefused follows the kernel log like the cubelet's --seccomp-log
// (seccomp.Watch, nsrt.SandboxOfPID) for sandboxes under parent.
func watchRefused(t *testing.T, ctx context.Context, parent string) *refusedLog {
	t.Helper()
	r := &refusedLog{by: map[string]map[string]int{}}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := seccomp.Watch(wctx, func(e seccomp.Event) {
			id, err := nsrt.SandboxOfPID(e.PID, parent)
			if err != nil {
				return
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.by[id] == nil {
				r.by[id] = map[string]int{}
			}
			r.by[id][e.Comm+":"+e.Syscall]++
		})
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func (r *refusedLog) calls(id string) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return map[string]int{"watch error: " + r.err.Error(): 1}
	}
	return r.by[id]
}

// workloadsTimeout bounds the whole script (each workload has 3 minutes).
var workloadsTimeout = 4 * time.Minute
