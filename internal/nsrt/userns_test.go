package nsrt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nativebin"
)

// usernsScript records what root inside a user-namespaced sandbox can do.
const usernsScript = `id -u > /tmp/uid; id -g > /tmp/gid; stat -c %u:%g /etc/passwd /bin/busybox > /tmp/template-owner;
touch /tmp/mine && chown 1000:1000 /tmp/mine && stat -c %u:%g /tmp/mine > /tmp/chown;
su -s /bin/sh user -c 'id -u; touch /home/user/f' > /tmp/user-uid 2>&1; stat -c %u /home/user/f > /tmp/user-file;
cat /mnt/host/secret > /tmp/secret 2>&1; echo $? > /tmp/secret-rc;
hostname evil 2>/dev/null; echo $? > /tmp/hostname-rc;
mount -t tmpfs x /mnt 2>/dev/null; echo $? > /tmp/mount-rc;
(nc -l -p 80 </dev/null >/dev/null 2>&1 &); sleep 0.2; cat /proc/net/tcp /proc/net/tcp6 | grep -c ':0050 0*:0000 0A' > /tmp/port80;
grep -v ':/$' /proc/self/cgroup | wc -l > /tmp/cgroupns; echo x >&3; exec sleep 1000`

func TestUserNamespace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := ProbeUserNS(e.rootfs, e.stateDir); err != nil {
		t.Skipf("no user namespaces with idmapped mounts here: %v", err)
	}
	for _, a := range []string{"id", "stat", "chown", "su", "nc", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(e.rootfs, "bin", a)); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(e.rootfs, "home", "user"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(e.rootfs, "home", "user"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	hostDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(hostDir, "secret"), []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	// B, the workload's first process: a second sandbox-init (no
	// cube-nsexec next to the test binary) or cube-nsexec.
	for _, b := range []struct{ name, nsexec string }{{"B=sandbox-init", ""}, {"B=cube-nsexec", nsexecBinary(t)}} {
		for _, disk := range []int{0, 32} {
			t.Run(b.name+"/disk="+strconv.Itoa(disk), func(t *testing.T) {
				if disk > 0 {
					if _, err := os.Stat("/dev/loop-control"); err != nil {
						t.Skip("no loop devices")
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
				defer cancel()
				spec := e.spec("/bin/sh", "-c", usernsScript)
				spec.ID = e.id + "-" + strconv.Itoa(disk)
				spec.StateDir = filepath.Join(e.stateDir, spec.ID)
				if err := os.Mkdir(spec.StateDir, 0o700); err != nil {
					t.Fatal(err)
				}
				spec.DiskSizeMB = disk
				spec.NetNSPath = newNetNS(t)
				spec.UserNS = UserNSForSlot(3)
				spec.UsernsExec = b.nsexec
				spec.Files = map[string]FileSpec{"/etc/passwd": {Data: []byte("root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n")}}
				spec.Binds = []Bind{{Source: hostDir, Target: "/mnt/host", ReadOnly: true}}
				sb, err := Start(ctx, e.exe, spec)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					if err := Cleanup(ctx, spec.StateDir, e.parent, spec.ID); err != nil {
						t.Errorf("Cleanup: %v", err)
					}
				})
				defer sb.Close()
				init := sb.InitPID()
				root := "/proc/" + strconv.Itoa(init) + "/root"
				read := rootReader(t, root)
				host := strconv.Itoa(int(spec.UserNS.HostID))
				// pid 1 stays host root (the reaper); the workload is its child.
				if got := statusIDs(t, init, "Uid:"); got != "0" {
					t.Errorf("pid 1 host uid = %s, want 0", got)
				}
				// ...but without any capability: it only reaps.
				for _, set := range []string{"CapEff:", "CapPrm:", "CapBnd:"} {
					if got := statusIDs(t, init, set); got != "0000000000000000" {
						t.Errorf("pid 1 %s %s, want none", set, got)
					}
				}
				assertReaperThreads(t, init)
				// Children are listed per thread (B is forked off another one).
				// The workload may still be between readiness and its last exec
				// (sh -> sleep): look again for a while.
				work, kids := 0, []byte(nil) // the workload (now sleep); nc was re-parented to pid 1 too
				for deadline := time.Now().Add(5 * time.Second); work == 0 && time.Now().Before(deadline); {
					tasks, err := filepath.Glob("/proc/" + strconv.Itoa(init) + "/task/*/children")
					if err != nil || len(tasks) == 0 {
						t.Fatal(tasks, err)
					}
					kids = nil
					for _, f := range tasks {
						b, _ := os.ReadFile(f)
						kids = append(kids, b...)
					}
					for _, k := range strings.Fields(string(kids)) {
						comm, _ := os.ReadFile("/proc/" + k + "/comm")
						if c := strings.TrimSpace(string(comm)); c == "sleep" || c == "sh" {
							work, _ = strconv.Atoi(k)
						}
					}
					if work == 0 {
						time.Sleep(50 * time.Millisecond)
					}
				}
				if work == 0 {
					var comms []string
					for _, k := range strings.Fields(string(kids)) {
						comm, _ := os.ReadFile("/proc/" + k + "/comm")
						comms = append(comms, k+"="+strings.TrimSpace(string(comm)))
					}
					t.Fatalf("no workload among pid 1 children %v", comms)
				}
				if got := statusIDs(t, work, "Uid:"); got != host {
					t.Errorf("workload host uid = %s, want %s", got, host)
				}
				if got := statusIDs(t, work, "Gid:"); got != host {
					t.Errorf("workload host gid = %s, want %s", got, host)
				}
				assertNoGOMAXPROCS(t, work)
				assertHardened(t, work)
				if cg, err := cgroup.Open(e.parent, spec.ID); err != nil {
					t.Error(err)
				} else if procs, err := cg.Procs(); err != nil || !slices.Contains(procs, work) {
					t.Errorf("sandbox cgroup procs %v, %v; want the workload %d", procs, err, work)
				}
				for f, want := range map[string]string{
					"/tmp/uid": "0", "/tmp/gid": "0", "/tmp/template-owner": "0:0\n0:0", "/tmp/chown": "1000:1000",
					"/tmp/user-uid": "1000", "/tmp/user-file": "1000", "/tmp/secret-rc": "1",
					"/tmp/hostname-rc": "1", "/tmp/mount-rc": "1", "/tmp/port80": "1", "/tmp/cgroupns": "0",
				} {
					if got := read(f); got != want {
						t.Errorf("%s = %q, want %q", f, got, want)
					}
				}
				// Files root inside wrote are stored unshifted (uid 0, 1000).
				var st syscall.Stat_t
				layer := spec.StateDir
				if disk > 0 {
					layer = root // the disk is mounted only inside; look through the overlay instead
				}
				if err := syscall.Stat(filepath.Join(layer, "upper", "tmp", "mine"), &st); disk == 0 && (err != nil || st.Uid != 1000) {
					t.Errorf("upper/tmp/mine on the host: uid %d, %v; want 1000", st.Uid, err)
				}
			})
		}
	}
}

// assertHardened checks that the workload pid kept SandboxCapabilities
// only (bounding, permitted, effective; no inheritable or ambient ones),
// with no_new_privs and a seccomp filter.
func assertHardened(t *testing.T, pid int) {
	t.Helper()
	var keep uint64
	for _, c := range SandboxCapabilities {
		keep |= 1 << c
	}
	want := map[string]string{
		"CapBnd:": fmt.Sprintf("%016x", keep), "CapPrm:": fmt.Sprintf("%016x", keep), "CapEff:": fmt.Sprintf("%016x", keep),
		"CapInh:": "0000000000000000", "CapAmb:": "0000000000000000", "NoNewPrivs:": "1", "Seccomp:": "2",
	}
	for key, w := range want {
		if got := statusIDs(t, pid, key); got != w {
			t.Errorf("workload %s %s, want %s", key, got, w)
		}
	}
}

// nsexecBinary builds cmd/cube-nsexec as make build does.
func nsexecBinary(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), NsexecName)
	if err := nativebin.Build(context.Background(), NsexecName, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// statusIDs returns the real id of a /proc/PID/status line (Uid:, Gid:).
func statusIDs(t *testing.T, pid int, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, key); ok {
			return strings.Fields(v)[0]
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return ""
}

// TestResolveUserNS checks the modes, the probe cache and the fallback of
// auto where the kernel refuses (an injected probe result: lowering
// user.max_user_namespaces would disturb other tests on the host).
func TestResolveUserNS(t *testing.T) {
	dir := t.TempDir()
	refused := errors.New("clone CLONE_NEWUSER: no space left on device")
	calls := 0
	probeUserNS = func(...string) error { calls++; return refused }
	t.Cleanup(func() {
		probeUserNS = ProbeUserNS
		probes.Lock()
		clear(probes.results)
		clear(probes.warned)
		probes.Unlock()
	})
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	for i := range 2 {
		u, err := ResolveUserNS(log, UserNSAuto, 5, dir, dir)
		if u != nil || err != nil {
			t.Fatalf("auto on a refusing kernel (%d): %+v, %v; want no user namespace", i, u, err)
		}
	}
	if calls != 1 || strings.Count(logs.String(), "without a user namespace") != 1 {
		t.Errorf("probe calls %d, logs %q; want one probe and one warning", calls, logs.String())
	}
	if _, err := ResolveUserNS(log, UserNSOn, 5, dir, dir); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("on on a refusing kernel: %v; want FailedPrecondition with the reason", err)
	}
	if u, err := ResolveUserNS(log, UserNSOff, 5, dir, dir); u != nil || err != nil {
		t.Errorf("off: %+v, %v", u, err)
	}
	if _, err := ResolveUserNS(log, "maybe", 5, dir, dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad mode: %v", err)
	}
	probes.Lock()
	clear(probes.results)
	probes.Unlock()
	probeUserNS = func(...string) error { return nil }
	u, err := ResolveUserNS(log, UserNSOn, 5, dir, dir)
	if err != nil || *u != (UserNS{HostID: 1<<30 + 5*65536, Size: 65536}) {
		t.Errorf("on on a capable kernel: %+v, %v", u, err)
	}
	if u := UserNSForSlot(UserNSSlots - 1); uint64(u.HostID)+uint64(u.Size) != 1<<31 {
		t.Errorf("last slot ends at %d, want 2^31", uint64(u.HostID)+uint64(u.Size))
	}
}

// TestUserNSFallbackStart starts a sandbox the way the cubelet does under
// auto on a kernel that refuses: it runs, without a user namespace.
func TestUserNSFallbackStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := e.spec("/bin/sh", "-c", "echo x >&3; exec sleep 1000")
	spec.UserNS = nil // what ResolveUserNS answers under auto there
	sb, err := Start(ctx, e.exe, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if got := statusIDs(t, sb.InitPID(), "Uid:"); got != "0" {
		t.Errorf("init host uid %s, want 0", got)
	}
}

// assertReaperThreads checks every thread of pid 1 once it only reaps: in a
// binary without cgo it reaps in sandbox-init's process (no exec of a
// reaper), where each Go runtime thread must have dropped its capabilities
// and carry no_new_privs and the seccomp filter.
func assertReaperThreads(t *testing.T, pid int) {
	t.Helper()
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_GETPID, 0, 0, 0); errno == syscall.ENOTSUP {
		t.Log("test binary built with cgo: pid 1 drops the capabilities of its reaping thread only (run with CGO_ENABLED=0 for the in-place reaper)")
		return
	}
	var comm []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		comm, _ = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if strings.TrimSpace(string(comm)) == reaperName {
			break
		}
	}
	if got := strings.TrimSpace(string(comm)); got != reaperName {
		t.Fatalf("pid 1 is %q, want %q", got, reaperName)
	}
	// Its command line no longer names host paths (readable in the sandbox).
	if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); strings.TrimRight(string(b), "\x00") != reaperName {
		t.Errorf("pid 1's command line is %q, want %q", b, reaperName)
	}
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/status")
	if err != nil || len(tasks) == 0 {
		t.Fatal(tasks, err)
	}
	t.Logf("pid 1 reaps in place with %d threads", len(tasks))
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"CapInh:": "0000000000000000", "CapPrm:": "0000000000000000",
			"CapEff:": "0000000000000000", "CapAmb:": "0000000000000000", "NoNewPrivs:": "1", "Seccomp:": "2"}
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) == 2 && want[f[0]] != "" {
				if f[1] != want[f[0]] {
					t.Errorf("%s: %s %s, want %s", task, f[0], f[1], want[f[0]])
				}
				delete(want, f[0])
			}
		}
		if len(want) > 0 {
			t.Errorf("%s lacks %v", task, want)
		}
	}
}

// The exec'd reaper gets the workload's pid and one P, whatever the
// spec's environment said.
func TestReaperEnv(t *testing.T) {
	got := reaperEnv([]string{"PATH=/bin", "GOMAXPROCS=8", "A=1"}, 42)
	want := []string{"PATH=/bin", "A=1", ReapPIDEnv + "=42", "GOMAXPROCS=1"}
	if !slices.Equal(got, want) {
		t.Errorf("reaperEnv = %q, want %q", got, want)
	}
}

// assertNoGOMAXPROCS checks that pid (a workload) did not inherit the
// GOMAXPROCS pid 1 and B run with (initEnv).
func assertNoGOMAXPROCS(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			t.Errorf("workload %d has %s in its environment", pid, kv)
		}
	}
}
