package security

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nsrt"
)

// snapshot lists a tree's paths, modes, sizes and mtimes.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %s %d %s\n", p, fi.Mode(), fi.Size(), fi.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestEscapesFail runs the probe's escape attempts as root inside a sandbox
// and checks every one is refused, and that the privileges the sandbox keeps
// are exactly the documented ones.
func TestEscapesFail(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := snapshot(t, w.rootfs)
	script := fmt.Sprintf("/bin/probe escapes %d %s > /shared/escapes 2>&1; echo x >&3; exec sleep 1000",
		os.Getpid(), w.rootfs)
	w.start(ctx, script, cgroup.Resources{CPUCount: 1, MemoryMB: 128, PidsMax: 64}, 0)
	out := w.readShared("escapes")
	got := results(out)
	want := map[string]string{
		"mount":               "EPERM", // seccomp
		"umount":              "EPERM",
		"finit_module":        "EPERM",
		"init_module":         "EPERM",
		"kexec_load":          "EPERM",
		"bpf":                 "EPERM",
		"perf_event_open":     "EPERM",
		"keyctl":              "EPERM",
		"unshare_user":        "EPERM",
		"unshare_mnt":         "EPERM",
		"mknod":               "EPERM", // no CAP_MKNOD
		"ptrace_host":         "ESRCH", // pid namespace: host pids do not exist
		"kill_host":           "ESRCH",
		"proc_host_root":      "ENOENT",
		"raw_socket":          "EPERM", // no CAP_NET_RAW
		"packet_socket":       "EPERM",
		"ping_socket":         "ok", // ICMP echo sockets work without NET_RAW
		"keys_empty":          "ok", // masked with /dev/null
		"timer_list_empty":    "ok",
		"proc_sys":            "EROFS",
		"sys_firmware_empty":  "ok",
		"lower_dir":           "ENOENT", // host paths are unreachable after pivot_root
		"write_template_file": "ok",     // copy-up into the sandbox's own layer
		"sethostname":         "EPERM",  // no CAP_SYS_ADMIN
		"settimeofday":        "EPERM",
		"userfaultfd":         "EPERM", // outside the seccomp allowlist
		"io_uring_setup":      "EPERM",
		"kcmp":                "EPERM",
		"open_by_handle_at":   "EPERM",
		"vsock_socket":        "EPERM",
		"personality_no_aslr": "EPERM",
		"setuid_child":        "ok", // envd's user switching still works
		"NoNewPrivs":          "1",
		"Seccomp":             "2",
		"CapInh":              "0000000000000000",
		"CapAmb":              "0000000000000000",
	}
	var mask uint64
	for _, c := range nsrt.SandboxCapabilities {
		mask |= 1 << c
	}
	want["CapEff"] = fmt.Sprintf("%016x", mask)
	want["CapBnd"] = fmt.Sprintf("%016x", mask)
	// Absent on kernels built without them; masked or read-only otherwise.
	if v := got["kcore_empty"]; v != "ok" && v != "ENOENT" {
		t.Errorf("kcore_empty = %q, want ok or ENOENT", v)
	}
	if v := got["sysrq"]; v != "EROFS" && v != "ENOENT" {
		t.Errorf("sysrq = %q, want EROFS or ENOENT", v)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if t.Failed() {
		t.Logf("probe output:\n%s", out)
	}
	if after := snapshot(t, w.rootfs); after != before {
		t.Errorf("template changed on the host:\nbefore %s\nafter %s", before, after)
	}
}

// TestDevicesCgroup checks the v1 device allowlist of a sandbox cgroup.
func TestDevicesCgroup(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sb := w.start(ctx, "echo x >&3; exec sleep 1000", cgroup.Resources{PidsMax: 16}, 0)
	cg := w.cgroupOf(sb)
	if cg.Version() != cgroup.V1 || cg.Dir("devices") == "" {
		t.Skip("no v1 devices controller on this host")
	}
	b, err := os.ReadFile(filepath.Join(cg.Dir("devices"), "devices.list"))
	if err != nil {
		t.Fatal(err)
	}
	list := string(b)
	for _, d := range cgroup.SandboxDevices {
		if !strings.Contains(list, d.String()) {
			t.Errorf("devices.list lacks %q:\n%s", d, list)
		}
	}
	if strings.Contains(list, "a *:* rwm") || strings.Contains(list, "b ") {
		t.Errorf("devices.list allows more than the sandbox devices:\n%s", list)
	}
	if n := strings.Count(strings.TrimSpace(list), "\n") + 1; n != len(cgroup.SandboxDevices) {
		t.Errorf("devices.list has %d entries, want %d:\n%s", n, len(cgroup.SandboxDevices), list)
	}
}
