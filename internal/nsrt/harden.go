package nsrt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/seccomp"
)

// SandboxCapabilities is the capability set the sandbox's init (and every
// root process inside) keeps: Docker's default set without NET_RAW and
// MKNOD. NET_RAW would let a sandbox forge packets from its own netns (ping
// still works: sandbox-init opens ICMP echo sockets to every group through
// net.ipv4.ping_group_range). MKNOD is not needed because /dev is provided,
// and without it a sandbox cannot make device nodes at all, which is the
// device barrier on cgroup v2 hosts where no devices controller exists.
// SETUID, SETGID (setgroups too), CHOWN, DAC_OVERRIDE, FOWNER and KILL are
// what envd uses to run commands as other users and manage their files.
var SandboxCapabilities = []uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_KILL, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP,
	unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_AUDIT_WRITE, unix.CAP_SETFCAP,
}

// maskedPaths are hidden from the sandbox as OCI runtimes do: files are
// covered with /dev/null, directories with an empty read-only tmpfs (one
// per sandbox, bound over each: every superblock costs the kernel memory in
// every memory cgroup's shrinker bookkeeping, see docs/benchmarks.md). They
// expose host kernel memory, keys, timers or hardware.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

// readonlyPaths are remounted read-only: host-wide kernel knobs.
var readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

// protectKernelFiles masks and write-protects /proc and /sys paths; it runs
// after /proc and /sys are mounted in the new root. Before /proc/sys turns
// read-only it opens ICMP echo sockets to every group of the sandbox's
// network namespace, so ping works without CAP_NET_RAW, and, for a
// workload in a user namespace (whose CAP_NET_BIND_SERVICE does not count
// in the host-owned network namespace), makes every port bindable.
func protectKernelFiles(userns bool) error {
	// Per network namespace; best effort (the netns may lack IPv4).
	_ = os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0)
	if userns {
		_ = os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0)
	}
	emptyDir := ""
	for _, p := range maskedPaths {
		if err := maskPath(p, &emptyDir); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readonlyPaths {
		if err := readonlyPath(p); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

// maskPath covers p: a file with /dev/null, a directory with the empty
// read-only tmpfs at *emptyDir, mounting it there first if *emptyDir is "".
func maskPath(p string, emptyDir *string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
	}
	if *emptyDir != "" {
		// A bind keeps the mount's flags: read-only, nosuid, nodev, noexec.
		return unix.Mount(*emptyDir, p, "", unix.MS_BIND, "")
	}
	if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=555"); err != nil {
		return err
	}
	*emptyDir = p
	return nil
}

func readonlyPath(p string) error {
	if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	return unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
}

// dropPrivileges is the last step of sandbox-init before exec, on the
// thread that execs: it shrinks the bounding set to caps (normally
// SandboxCapabilities), clears the ambient and inheritable sets, keeps caps
// as effective and permitted, sets no_new_privs and installs the seccomp
// profile chosen by sc. The exec'd init, as uid 0 without file
// capabilities, gets the bounding set as its permitted set; nothing it
// execs can gain more. Cube's own namespace work (the workload's user
// namespace, cgroup namespaces) is done before this: the filter refuses
// namespace creation.
func dropPrivileges(caps []uintptr, sc *Seccomp) error {
	return dropPrivilegesWith(unix.Capset, caps, sc)
}

// dropPrivilegesAllThreads is dropPrivileges for a process that goes on
// without an exec (pid 1 reaping in place): the capability sets are per
// thread, and an exec would have left only the calling thread's. Every
// thread of the Go runtime gets the effective, permitted and inheritable
// sets (the ambient set follows them); seccomp and no_new_privs reach
// every thread anyway (TSYNC). The bounding set, which only an execve
// consults, shrinks on the calling thread, as before an exec: a thread
// that has no permitted capability and no_new_privs gains none by an exec
// whatever its bounding set (and none of these threads execs). It fails
// with errAllThreads in a binary built with cgo, where the Go runtime
// cannot reach every thread; by then only the calling thread's bounding
// and ambient sets have shrunk, which dropPrivileges repeats harmlessly.
func dropPrivilegesAllThreads(caps []uintptr, sc *Seccomp) error {
	err := dropPrivilegesWith(capsetAllThreads, caps, sc)
	if errors.Is(err, syscall.ENOTSUP) {
		return errAllThreads
	}
	return err
}

// capsetAllThreads is capset(2) on every thread. The pointer conversions
// stay in the call (uintptrescapes: hdr and data live on the heap while
// the call runs on each thread). Each call stops the world and signals
// every thread (~0.1 ms here), hence one call, not one per capability.
func capsetAllThreads(hdr *unix.CapUserHeader, data *unix.CapUserData) error {
	_, _, errno := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(hdr)), uintptr(unsafe.Pointer(data)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// errAllThreads: the binary cannot change every thread's credentials.
var errAllThreads = errors.New("credentials of every thread cannot be changed in a binary built with cgo")

// dropPrivilegesWith is dropPrivileges with capset applied through
// capset (the calling thread's, or every thread's).
func dropPrivilegesWith(capset func(*unix.CapUserHeader, *unix.CapUserData) error, caps []uintptr, sc *Seccomp) error {
	keep := map[uintptr]bool{}
	for _, c := range caps {
		keep[c] = true
	}
	for c := uintptr(0); c <= unix.CAP_LAST_CAP+8; c++ { // +8: caps newer than x/sys
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	var data [2]unix.CapUserData
	for c := range keep {
		data[c/32].Effective |= 1 << (c % 32)
		data[c/32].Permitted |= 1 << (c % 32)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("set capabilities: %w", err)
	}
	if err := seccomp.SetNoNewPrivs(); err != nil {
		return err
	}
	return sc.install()
}
