package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData is struct seccomp_data as the filter sees it on a
// little-endian machine. The kernel loads 32-bit words in host order, the
// x/net/bpf VM in network order, so each word is stored big-endian at the
// offset where the kernel finds it.
func seccompData(arch, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], nr)
	binary.BigEndian.PutUint32(b[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[16+8*i+4:], uint32(a>>32))
	}
	return b
}

func vm(t *testing.T, rules []Rule) *bpf.VM {
	t.Helper()
	prog, err := Build(rules)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]bpf.RawInstruction, len(prog))
	for i, f := range prog {
		raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("filter does not disassemble")
	}
	v, err := bpf.NewVM(insns)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestBuildDecisions(t *testing.T) {
	arch, ok := nativeArch()
	if !ok {
		t.Skip("unsupported architecture")
	}
	v := vm(t, DefaultRules())
	allow := uint32(unix.SECCOMP_RET_ALLOW)
	cases := []struct {
		name string
		data []byte
		want uint32
	}{
		{"getpid allowed", seccompData(arch, unix.SYS_GETPID), allow},
		{"mount denied", seccompData(arch, unix.SYS_MOUNT), retErrno(unix.EPERM)},
		{"bpf denied", seccompData(arch, unix.SYS_BPF), retErrno(unix.EPERM)},
		{"kexec denied", seccompData(arch, unix.SYS_KEXEC_LOAD), retErrno(unix.EPERM)},
		{"init_module denied", seccompData(arch, unix.SYS_INIT_MODULE), retErrno(unix.EPERM)},
		{"clone3 ENOSYS", seccompData(arch, unix.SYS_CLONE3), retErrno(unix.ENOSYS)},
		{"clone fork allowed", seccompData(arch, unix.SYS_CLONE, uint64(unix.SIGCHLD)), allow},
		{"clone thread allowed", seccompData(arch, unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_THREAD|unix.CLONE_SIGHAND), allow},
		{"clone newuser denied", seccompData(arch, unix.SYS_CLONE, unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), retErrno(unix.EPERM)},
		{"unshare newuser denied", seccompData(arch, unix.SYS_UNSHARE, unix.CLONE_NEWUSER), retErrno(unix.EPERM)},
		{"unshare files allowed", seccompData(arch, unix.SYS_UNSHARE, unix.CLONE_FILES), allow},
		{"high arg bits ignored", seccompData(arch, unix.SYS_UNSHARE, 1<<40), allow},
		{"foreign arch killed", seccompData(unix.AUDIT_ARCH_I386, unix.SYS_GETPID), unix.SECCOMP_RET_KILL_PROCESS},
		{"ptrace allowed", seccompData(arch, unix.SYS_PTRACE), allow},
	}
	if runtime.GOARCH == "amd64" {
		cases = append(cases, struct {
			name string
			data []byte
			want uint32
		}{"x32 killed", seccompData(arch, x32SyscallBit|unix.SYS_GETPID), unix.SECCOMP_RET_KILL_PROCESS})
	}
	for _, c := range cases {
		got, err := v.Run(c.data)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if uint32(got) != c.want {
			t.Errorf("%s: filter returned %#x, want %#x", c.name, uint32(got), c.want)
		}
	}
}

func TestBuildRejectsBadRules(t *testing.T) {
	if _, ok := nativeArch(); !ok {
		t.Skip("unsupported architecture")
	}
	if _, err := Build([]Rule{{Name: "x", Nr: 1}}); err == nil {
		t.Error("rule without errno accepted")
	}
	if _, err := Build([]Rule{{Name: "x", Nr: 1, Errno: unix.EPERM, Arg: 6, ArgMask: 1}}); err == nil {
		t.Error("argument index 6 accepted")
	}
	if err := Install(nil); err == nil {
		t.Error("empty filter installed")
	}
}

const childEnv = "CUBE_SECCOMP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// child installs the default profile and reports what the kernel answers.
func child() int {
	runtime.LockOSThread()
	if err := SetNoNewPrivs(); err != nil {
		fmt.Println(err)
		return 1
	}
	if err := InstallDefault(); err != nil {
		fmt.Println(err)
		return 1
	}
	report := func(name string, err error) {
		fmt.Printf("%s=%v\n", name, errnoName(err))
	}
	report("mount", unix.Mount("none", "/mnt", "tmpfs", 0, ""))
	report("unshare-user", unix.Unshare(unix.CLONE_NEWUSER))
	_, _, e := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
	report("bpf", errOrNil(e))
	_, _, e = unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0)
	report("keyctl", errOrNil(e))
	var args [88]byte
	_, _, e = unix.Syscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args), 0)
	report("clone3", errOrNil(e))
	report("exec", exec.Command("/bin/sh", "-c", "true").Run())
	report("getpid", nil)
	return 0
}

func errOrNil(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func errnoName(err error) string {
	var e unix.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	if err != nil {
		return err.Error()
	}
	return "ok"
}

func TestInstallInKernel(t *testing.T) {
	if _, ok := nativeArch(); !ok {
		t.Skip("unsupported architecture")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	for _, want := range []string{"mount=EPERM", "unshare-user=EPERM", "bpf=EPERM", "keyctl=EPERM",
		"clone3=ENOSYS", "exec=ok", "getpid=ok"} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("child output lacks %q:\n%s", want, out)
		}
	}
}
