package seccomp

import "golang.org/x/sys/unix"

// cloneNewNamespaces are the clone/unshare flags that make namespaces. A
// sandbox without CAP_SYS_ADMIN gets EPERM for all but CLONE_NEWUSER from
// the kernel itself; CLONE_NEWUSER is refused by the filter because a new
// user namespace hands its creator every capability over fresh mount and
// network namespaces, a large kernel attack surface that sandboxes do not
// need. Denying the lot keeps the rule simple and independent of caps.
const cloneNewNamespaces = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
	unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// deny is an unconditional EPERM rule.
func deny(name string, nr uintptr) Rule { return Rule{Name: name, Nr: uint32(nr), Errno: unix.EPERM} }

// DefaultRules is the sandbox profile: what Docker's and Podman's default
// profiles deny (or only allow with capabilities a sandbox never holds),
// plus io_uring, whose syscalls bypass per-syscall filtering. ptrace,
// process_vm_readv/writev and kcmp stay allowed, as in Docker on kernels
// >= 4.8: a sandbox can debug its own processes (strace, gdb), and the pid
// namespace makes host processes unnameable.
func DefaultRules() []Rule {
	rules := []Rule{
		// Kernel code and kernel state.
		deny("init_module", unix.SYS_INIT_MODULE),
		deny("finit_module", unix.SYS_FINIT_MODULE),
		deny("delete_module", unix.SYS_DELETE_MODULE),
		deny("kexec_load", unix.SYS_KEXEC_LOAD),
		deny("kexec_file_load", unix.SYS_KEXEC_FILE_LOAD),
		deny("bpf", unix.SYS_BPF),
		deny("perf_event_open", unix.SYS_PERF_EVENT_OPEN),
		deny("reboot", unix.SYS_REBOOT),
		deny("swapon", unix.SYS_SWAPON),
		deny("swapoff", unix.SYS_SWAPOFF),
		deny("acct", unix.SYS_ACCT),
		deny("quotactl", unix.SYS_QUOTACTL),
		deny("quotactl_fd", unix.SYS_QUOTACTL_FD),
		deny("lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE),
		deny("syslog", unix.SYS_SYSLOG),
		deny("userfaultfd", unix.SYS_USERFAULTFD),
		deny("fanotify_init", unix.SYS_FANOTIFY_INIT),
		// Keyrings are not namespaced.
		deny("keyctl", unix.SYS_KEYCTL),
		deny("add_key", unix.SYS_ADD_KEY),
		deny("request_key", unix.SYS_REQUEST_KEY),
		// Clocks are not namespaced (time namespaces only offset monotonic/boottime).
		deny("settimeofday", unix.SYS_SETTIMEOFDAY),
		deny("clock_settime", unix.SYS_CLOCK_SETTIME),
		deny("clock_adjtime", unix.SYS_CLOCK_ADJTIME),
		// Mounts and file handles (open_by_handle_at was the "shocker" escape).
		deny("mount", unix.SYS_MOUNT),
		deny("umount2", unix.SYS_UMOUNT2),
		deny("pivot_root", unix.SYS_PIVOT_ROOT),
		deny("open_tree", unix.SYS_OPEN_TREE),
		deny("move_mount", unix.SYS_MOVE_MOUNT),
		deny("fsopen", unix.SYS_FSOPEN),
		deny("fsconfig", unix.SYS_FSCONFIG),
		deny("fsmount", unix.SYS_FSMOUNT),
		deny("fspick", unix.SYS_FSPICK),
		deny("mount_setattr", unix.SYS_MOUNT_SETATTR),
		deny("name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT),
		deny("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT),
		// Namespaces.
		deny("setns", unix.SYS_SETNS),
		{Name: "unshare", Nr: unix.SYS_UNSHARE, Errno: unix.EPERM, Arg: 0, ArgMask: cloneNewNamespaces},
		{Name: "clone", Nr: unix.SYS_CLONE, Errno: unix.EPERM, Arg: cloneFlagsArg, ArgMask: cloneNewNamespaces},
		// clone3 passes its flags in memory, out of the filter's reach; ENOSYS
		// makes glibc and Go fall back to clone.
		{Name: "clone3", Nr: unix.SYS_CLONE3, Errno: unix.ENOSYS},
		// io_uring runs operations without passing through this filter.
		deny("io_uring_setup", unix.SYS_IO_URING_SETUP),
		deny("io_uring_enter", unix.SYS_IO_URING_ENTER),
		deny("io_uring_register", unix.SYS_IO_URING_REGISTER),
	}
	return append(rules, archRules()...)
}
