// Command probe runs inside a test sandbox (static, CGO_ENABLED=0) and
// tries what a hostile workload would: escapes print "name=ERRNO" (or
// "name=ok" when the kernel allowed it), resource abusers consume memory or
// disk, and "serve" answers on a unix socket to prove a sandbox responsive.
// It is built and bound into sandboxes by the tests in test/security.
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe escapes HOSTPID LOWERDIR | hog MB | fill PATH | serve SOCK | refuse | loop N")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "escapes":
		escapes(os.Args[2], os.Args[3])
	case "hog":
		mb, _ := strconv.Atoi(os.Args[2])
		hog(mb)
	case "fill":
		fill(os.Args[2])
	case "serve":
		serve(os.Args[2])
	case "refuse": // one call outside the allowlist, for the seccomp log
		_, _, e := unix.Syscall(unix.SYS_KCMP, 0, 0, 0)
		report("kcmp", errno(e))
		time.Sleep(time.Second) // stay mappable to the sandbox (pid -> cgroup)
	case "loop":
		n, _ := strconv.Atoi(os.Args[2])
		loop(n)
	default:
		os.Exit(2)
	}
}

func name(err error) string {
	var e syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &e):
		return unix.ErrnoName(e)
	default:
		return strings.ReplaceAll(err.Error(), " ", "_")
	}
}

func errno(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func report(what string, err error) { fmt.Printf("%s=%s\n", what, name(err)) }

func escapes(hostPID, lowerDir string) {
	report("mount", unix.Mount("tmpfs", "/mnt", "tmpfs", 0, ""))
	report("umount", unix.Unmount("/proc", unix.MNT_DETACH))
	null, _ := os.Open("/dev/null")
	_, _, e := unix.Syscall(unix.SYS_FINIT_MODULE, null.Fd(), uintptr(unsafe.Pointer(&[1]byte{})), 0)
	report("finit_module", errno(e))
	_, _, e = unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
	report("init_module", errno(e))
	_, _, e = unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
	report("kexec_load", errno(e))
	_, _, e = unix.Syscall(unix.SYS_BPF, 0, 0, 0)
	report("bpf", errno(e))
	_, _, e = unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0, 0, 0, 0)
	report("perf_event_open", errno(e))
	_, _, e = unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0)
	report("keyctl", errno(e))
	report("unshare_user", unix.Unshare(unix.CLONE_NEWUSER))
	report("unshare_mnt", unix.Unshare(unix.CLONE_NEWNS))
	report("mknod", unix.Mknod("/tmp/sda", unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))))
	pid, _ := strconv.Atoi(hostPID)
	report("ptrace_host", unix.PtraceAttach(pid))
	report("kill_host", unix.Kill(pid, 0))
	_, err := os.Stat("/proc/" + hostPID + "/root")
	report("proc_host_root", err)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	report("raw_socket", err)
	unix.Close(fd)
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	report("packet_socket", err)
	unix.Close(fd)
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, unix.IPPROTO_ICMP)
	report("ping_socket", err)
	unix.Close(fd)
	for _, f := range []string{"kcore", "keys", "timer_list"} {
		b, err := os.ReadFile("/proc/" + f)
		if err == nil && len(b) > 0 {
			err = errors.New("read_" + strconv.Itoa(len(b)) + "_bytes")
		}
		report(f+"_empty", err)
	}
	report("sysrq", os.WriteFile("/proc/sysrq-trigger", []byte("h"), 0))
	report("proc_sys", os.WriteFile("/proc/sys/kernel/domainname", []byte("x"), 0))
	ents, err := os.ReadDir("/sys/firmware")
	if err == nil && len(ents) > 0 {
		err = errors.New("not_empty")
	}
	report("sys_firmware_empty", err)
	_, err = os.Stat(lowerDir)
	report("lower_dir", err)
	report("write_template_file", os.WriteFile("/etc/passwd", []byte("overwritten\n"), 0o644))
	report("sethostname", unix.Sethostname([]byte("evil")))
	tv := unix.Timeval{Sec: 1}
	report("settimeofday", unix.Settimeofday(&tv))
	// Outside the allowlist (internal/seccomp): EPERM from the filter,
	// though the kernel would run them for root in a sandbox.
	_, _, e = unix.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
	report("userfaultfd", errno(e))
	var params [120]byte // struct io_uring_params
	_, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	report("io_uring_setup", errno(e))
	self := uintptr(os.Getpid())
	_, _, e = unix.Syscall6(unix.SYS_KCMP, self, self, 0 /* KCMP_FILE */, 0, 0, 0)
	report("kcmp", errno(e))
	_, _, e = unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, 0, 0, 0)
	report("open_by_handle_at", errno(e))
	vs, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.Close(vs)
	}
	report("vsock_socket", err)
	_, _, e = unix.Syscall(unix.SYS_PERSONALITY, 0x0040000 /* ADDR_NO_RANDOMIZE */, 0, 0)
	report("personality_no_aslr", errno(e))
	cmd := exec.Command("/bin/sh", "-c", "id -u")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{1000}}}
	out, err := cmd.Output()
	if err == nil && strings.TrimSpace(string(out)) != "1000" {
		err = errors.New("uid_" + strings.TrimSpace(string(out)))
	}
	report("setuid_child", err)
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		for _, k := range []string{"CapEff", "CapBnd", "CapInh", "CapAmb", "NoNewPrivs", "Seccomp"} {
			if v, ok := strings.CutPrefix(l, k+":"); ok {
				fmt.Printf("%s=%s\n", k, strings.TrimSpace(v))
			}
		}
	}
}

// hog allocates and touches mb MiB, then reports (if it survives).
func hog(mb int) {
	var keep [][]byte
	for range mb {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		keep = append(keep, b)
	}
	fmt.Println("hog survived", len(keep))
}

// fill writes zeros to path until an error, and reports it.
func fill(path string) {
	f, err := os.Create(path)
	if err != nil {
		report("fill", err)
		return
	}
	buf := make([]byte, 1<<20)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if err != nil {
			report("fill", err)
			fmt.Printf("written=%d\n", n)
			return
		}
	}
}

// serve signals readiness on fd 3 and echoes one line per connection on
// the unix socket at path.
func serve(path string) {
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	os.NewFile(3, "ready").Write([]byte{1})
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			_, _ = io.CopyN(c, c, 3)
		}()
	}
}

// loop times n rounds of each of a few syscalls and prints "name=ns/call":
// what a syscall-heavy workload pays for the seccomp filter. getppid and
// fstatat are constant answers the kernel caches per syscall (>= 5.11);
// socket is checked on its argument every time; fork (clone) too, plus
// the process it makes.
func loop(n int) {
	var st unix.Stat_t
	time := func(name string, rounds int, f func()) {
		start := nanotime()
		for range rounds {
			f()
		}
		fmt.Printf("%s=%d\n", name, (nanotime()-start)/int64(rounds))
	}
	time("getppid", n, func() { unix.Getppid() })
	time("fstatat", n, func() { _ = unix.Fstatat(unix.AT_FDCWD, "/", &st, 0) })
	time("socket_close", n/4, func() {
		if fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM, 0); err == nil {
			unix.Close(fd)
		}
	})
	time("refused_kcmp", n/4, func() { unix.Syscall6(unix.SYS_KCMP, 1, 1, 0, 0, 0, 0) })
	time("fork_wait", max(n/1000, 10), func() {
		pid, _, e := unix.RawSyscall(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0)
		if e != 0 {
			return
		}
		if pid == 0 {
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
		}
		var ws unix.WaitStatus
		unix.Wait4(int(pid), &ws, 0, nil)
	})
}

func nanotime() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
