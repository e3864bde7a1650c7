package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// devOp is one device access performed by the helper process.
type devOp struct {
	Mknod  bool       // mknod Path as Node, else open Path with Access
	Access string     // "r", "w", "rw"
	Path   string     // node to open, or to create
	Node   devRequest // the device (Access is "m" for mknod)
}

const helperEnv = "CUBE_TEST_DEVICE_OPS"

// TestDeviceHelper is not a test: it is the process that runs inside the
// cgroup under test (see runDeviceOps) and reports one errno per op.
func TestDeviceHelper(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		t.Skip("helper process only")
	}
	var ops []devOp
	if err := json.Unmarshal([]byte(raw), &ops); err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	self, _ := os.ReadFile("/proc/self/cgroup")
	for _, line := range strings.Split(string(self), "\n") {
		if strings.HasPrefix(line, "0::") {
			fmt.Println("CGROUP", strings.TrimPrefix(line, "0::"))
		}
	}
	for i, op := range ops {
		var err error
		if op.Mknod {
			mode := uint32(unix.S_IFCHR)
			if op.Node.Type == 'b' {
				mode = unix.S_IFBLK
			}
			err = unix.Mknod(op.Path, mode|0o600, int(unix.Mkdev(op.Node.Major, op.Node.Minor)))
		} else {
			flags := map[string]int{"r": unix.O_RDONLY, "w": unix.O_WRONLY, "rw": unix.O_RDWR}[op.Access]
			var fd int
			fd, err = unix.Open(op.Path, flags|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
			if err == nil {
				unix.Close(fd)
			}
		}
		var errno unix.Errno
		if err != nil && !errors.As(err, &errno) {
			errno = 255
		}
		fmt.Println("RESULT", i, int(errno))
	}
	// Returning lets the testing package print its PASS line, which
	// runDeviceOps skips: it reads only CGROUP and RESULT lines.
}

// runDeviceOps runs ops in a new process started directly in the cgroup2
// directory dir (CLONE_INTO_CGROUP) and returns the errno of each op.
func runDeviceOps(t *testing.T, dir, wantCgroup string, ops []devOp) []unix.Errno {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	raw, _ := json.Marshal(ops)
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeviceHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s%s", err, out, stderr.Bytes())
	}
	res := make([]unix.Errno, len(ops))
	seen, inCgroup := 0, ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "CGROUP":
			inCgroup = f[1]
		case len(f) == 3 && f[0] == "RESULT":
			i, _ := strconv.Atoi(f[1])
			e, _ := strconv.Atoi(f[2])
			res[i] = unix.Errno(e)
			seen++
		}
	}
	if seen != len(ops) || inCgroup != wantCgroup {
		t.Fatalf("helper in cgroup %q (want %q) reported %d of %d results:\n%s", inCgroup, wantCgroup, seen, len(ops), out)
	}
	return res
}

// mountCgroup2 mounts a cgroup2 hierarchy (and a tmpfs for device nodes)
// under a temporary directory; both are unmounted in cleanup.
func mountCgroup2(t *testing.T) (cgroupRoot, devDir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir := t.TempDir()
	cgroupRoot, devDir = filepath.Join(dir, "cgroup2"), filepath.Join(dir, "dev")
	for _, d := range []string{cgroupRoot, devDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("none", cgroupRoot, "cgroup2", 0, ""); err != nil {
		t.Skipf("mount cgroup2: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(cgroupRoot, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", cgroupRoot, err)
		}
	})
	// tmpfs without nodev, whatever the temp directory's mount says.
	if err := unix.Mount("tmpfs", devDir, "tmpfs", 0, "mode=755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(devDir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", devDir, err)
		}
	})
	return cgroupRoot, devDir
}

// attachedIDs returns the device programs attached to the cgroup at dir.
func attachedIDs(t *testing.T, dir string) []uint32 {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ids, err := attachedDevicePrograms(fd)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// waitProgramGone waits until the kernel has freed program id.
func waitProgramGone(t *testing.T, id uint32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if errors.Is(err, unix.ENOENT) {
			return
		}
		if err == nil {
			p.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("program %d still exists (%v)", id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDevicesV2FailsClosed: the v2 path attaches the device allowlist
// program; a plain directory is no cgroup, so it fails (closed) instead of
// running unrestricted. Root only: without it the kernel refuses the BPF
// query itself, which reads as a kernel without device programs.
func TestDevicesV2FailsClosed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: queries cgroup BPF programs")
	}
	root := t.TempDir()
	sb := filepath.Join(root, "cube", "sb")
	if err := os.MkdirAll(sb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"memory.max", "memory.swap.max", "pids.max", "cpu.max"} {
		if err := os.WriteFile(filepath.Join(sb, f), []byte("max\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cg, err := OpenLayout(Layout{Version: V2, Unified: root, V1: map[string]string{}}, "cube", "sb")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.SetResources(Resources{Devices: SandboxDevices}); err == nil || !strings.Contains(err.Error(), "device allowlist") {
		t.Errorf("v2 device allowlist on a non-cgroup directory: %v, want an error", err)
	}
}

func TestDevicesV2Kernel(t *testing.T) {
	root, devDir := mountCgroup2(t)
	l := Layout{Version: V2, Unified: root, V1: map[string]string{}}
	parent := randName(t, "cube-test-")
	cg, err := OpenLayout(l, parent, "sb")
	if err != nil {
		t.Fatal(err)
	}
	dir := cg.Dir("")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cg.Remove(context.Background())
		_ = os.Remove(filepath.Join(root, parent))
	})
	wantCgroup := "/" + parent + "/sb"

	nodes := map[string]devRequest{
		"null": {'c', 1, 3, ""}, "zero": {'c', 1, 5, ""}, "mem": {'c', 1, 1, ""},
		"vcs": {'c', 7, 0, ""}, "pts": {'c', 136, 0, ""}, "loop": {'b', 7, 0, ""}, "blk": {'b', 8, 3, ""},
	}
	for name, n := range nodes {
		mode := uint32(unix.S_IFCHR)
		if n.Type == 'b' {
			mode = unix.S_IFBLK
		}
		if err := unix.Mknod(filepath.Join(devDir, name), mode|0o600, int(unix.Mkdev(n.Major, n.Minor))); err != nil {
			t.Fatal(err)
		}
	}
	run := 0
	makeOps := func() []devOp {
		run++
		var ops []devOp
		for _, o := range []struct{ node, access string }{
			{"null", "r"}, {"null", "rw"}, {"null", "w"}, {"zero", "rw"}, {"mem", "r"}, {"vcs", "r"},
			{"pts", "rw"}, {"loop", "r"}, {"loop", "rw"}, {"blk", "w"},
		} {
			n := nodes[o.node]
			n.Access = o.access
			ops = append(ops, devOp{Access: o.access, Path: filepath.Join(devDir, o.node), Node: n})
		}
		for i, n := range []devRequest{{'c', 1, 3, "m"}, {'c', 1, 9, "m"}, {'b', 7, 0, "m"}, {'b', 8, 3, "m"}} {
			ops = append(ops, devOp{Mknod: true, Path: filepath.Join(devDir, fmt.Sprintf("mk%d-%d", run, i)), Node: n})
		}
		return ops
	}
	describe := func(op devOp) string {
		verb := "open " + op.Access
		if op.Mknod {
			verb = "mknod"
		}
		return fmt.Sprintf("%s %c %d:%d", verb, op.Node.Type, op.Node.Major, op.Node.Minor)
	}

	// Baseline without a program: nothing is EPERM, so every EPERM below
	// comes from the allowlist.
	ops := makeOps()
	baseline := runDeviceOps(t, dir, wantCgroup, ops)
	for i, e := range baseline {
		t.Logf("baseline %s = %v", describe(ops[i]), e)
		if e == unix.EPERM || e == unix.EACCES {
			t.Fatalf("without an allowlist, %s = %v", describe(ops[i]), e)
		}
	}

	check := func(name string, rules []Device) uint32 {
		t.Helper()
		ids := attachedIDs(t, dir)
		if len(ids) != 1 {
			t.Fatalf("%s: %d device programs attached, want 1", name, len(ids))
		}
		ops := makeOps()
		for i, e := range runDeviceOps(t, dir, wantCgroup, ops) {
			allowed := allowedByRules(rules, ops[i].Node)
			switch {
			case !allowed && e != unix.EPERM:
				t.Errorf("%s: %s = %v, want EPERM", name, describe(ops[i]), e)
			case allowed && e != baseline[i]:
				t.Errorf("%s: %s = %v, want %v as without allowlist", name, describe(ops[i]), e, baseline[i])
			}
		}
		return ids[0]
	}

	if err := setDevicesV2(dir, SandboxDevices); err != nil {
		t.Fatal(err)
	}
	first := check("sandbox", SandboxDevices)
	if err := setDevicesV2(dir, SandboxDevices); err != nil {
		t.Fatal(err)
	}
	if id := check("sandbox again", SandboxDevices); id != first {
		t.Errorf("re-apply replaced program %d by %d, want it kept", first, id)
	}

	prev := first
	for _, name := range []string{"wildcards", "all-then-more", "deny-all", "mknod-only", "sandbox"} {
		if err := setDevicesV2(dir, ruleSets[name]); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		id := check(name, ruleSets[name])
		if id == prev {
			t.Errorf("%s: program %d not replaced", name, id)
		}
		waitProgramGone(t, prev)
		prev = id
	}

	// A duplicate stacked next to ours (as by an older, non-idempotent
	// attach) is detached, keeping the original.
	insns, _ := deviceProgram(SandboxDevices)
	dup, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: devicesProgName, Type: ebpf.CGroupDevice, AttachType: ebpf.AttachCGroupDevice,
		Instructions: asmOf(t, insns), License: devicesProgLicense,
	})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: fd, Program: dup, Attach: ebpf.AttachCGroupDevice, Flags: unix.BPF_F_ALLOW_MULTI,
	})
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := dup.Info()
	id, _ := info.ID()
	dupID := uint32(id)
	dup.Close()
	if n := len(attachedIDs(t, dir)); n != 2 {
		t.Fatalf("%d programs after stacking a duplicate, want 2", n)
	}
	if err := setDevicesV2(dir, SandboxDevices); err != nil {
		t.Fatal(err)
	}
	if id := check("deduplicated", SandboxDevices); id != prev {
		t.Errorf("kept program %d, want the original %d", id, prev)
	}
	waitProgramGone(t, dupID)

	// Removing the cgroup detaches and frees the program.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	waitProgramGone(t, prev)
}
