package seccomp

import "golang.org/x/sys/unix"

// The sandbox profile is an allowlist in the spirit of Docker's default
// seccomp profile (moby profiles/seccomp/default.json) for a container
// holding Cube's capability set (nsrt.SandboxCapabilities: no SYS_ADMIN,
// SYS_PTRACE, SYS_TIME, SYS_NICE, SYS_MODULE, ...). Names absent from an
// architecture's table are skipped there (open, fork, ... on arm64), as
// libseccomp does. Where Cube departs from Docker it says so.

// allowed are the syscalls a sandbox may make with any arguments.
var allowed = []string{
	// Files and directories.
	"access", "chdir", "chmod", "chown", "close", "close_range", "copy_file_range", "creat",
	"dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fallocate", "fchdir",
	"fchmod", "fchmodat", "fchmodat2", "fchown", "fchownat", "fcntl", "fdatasync", "flock",
	"fstat", "fstatfs", "fsync", "ftruncate", "futimesat", "getcwd", "getdents", "getdents64",
	"lchown", "link", "linkat", "lseek", "lstat", "mkdir", "mkdirat", "mknod", "mknodat",
	"newfstatat", "open", "openat", "openat2", "pread64", "preadv", "preadv2", "pwrite64",
	"pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "rename",
	"renameat", "renameat2", "rmdir", "sendfile", "splice", "stat", "statfs", "statx",
	"symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate", "umask",
	"unlink", "unlinkat", "utime", "utimensat", "utimes", "vmsplice", "write", "writev",
	"chroot",                                    // CAP_SYS_CHROOT is in the sandbox's set
	"cachestat", "file_getattr", "file_setattr", // newer than Docker's list; read/set what statx and ioctls already do
	// Extended attributes (the *xattrat calls are newer than Docker's list).
	"fgetxattr", "flistxattr", "fremovexattr", "fsetxattr", "getxattr", "lgetxattr",
	"listxattr", "llistxattr", "lremovexattr", "lsetxattr", "removexattr", "setxattr",
	"getxattrat", "listxattrat", "removexattrat", "setxattrat",
	// File change notification (fanotify_init stays out, see below).
	"inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "fanotify_mark",
	// Asynchronous I/O (not io_uring, see below).
	"io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_setup", "io_submit",
	"ioprio_get", "ioprio_set",
	// Memory.
	"brk", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mlock",
	"mlock2", "mlockall", "mmap", "mprotect", "mremap", "msync", "munlock", "munlockall",
	"munmap", "pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages",
	"map_shadow_stack", "mseal", // newer than Docker's list; used by recent glibc
	// Processes, threads, signals.
	"capget", "capset", "execve", "execveat", "exit", "exit_group", "fork", "vfork",
	"getcpu", "getegid", "geteuid", "getgid", "getgroups", "getpgid", "getpgrp", "getpid",
	"getppid", "getpriority", "getrandom", "getresgid", "getresuid", "getrlimit", "get_robust_list",
	"getrusage", "getsid", "gettid", "getuid", "kill", "pidfd_open", "pidfd_send_signal",
	"prctl", "prlimit64", "process_mrelease", "restart_syscall", "rseq", "rt_sigaction",
	"rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
	"rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
	"sched_getparam", "sched_get_priority_max", "sched_get_priority_min",
	"sched_getscheduler", "sched_rr_get_interval", "sched_setaffinity", "sched_setattr",
	"sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "setfsgid", "setfsuid",
	"setgid", "setgroups", "setpgid", "setpriority", "setregid", "setresgid", "setresuid",
	"setreuid", "setrlimit", "set_robust_list", "setsid", "set_tid_address", "setuid",
	"sigaltstack", "tgkill", "tkill", "wait4", "waitid",
	"landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self",
	// ptrace and process_vm_* as Docker on kernels >= 4.8: a sandbox can
	// strace/gdb its own processes; the pid namespace hides the host's.
	"ptrace", "process_vm_readv", "process_vm_writev",
	// Futexes.
	"futex", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue",
	// Time and timers (reading; setting the clock stays out).
	"adjtimex", "alarm", "clock_getres", "clock_gettime", "clock_nanosleep", "getitimer",
	"gettimeofday", "nanosleep", "setitimer", "time", "timer_create", "timer_delete",
	"timer_getoverrun", "timer_gettime", "timer_settime", "timerfd_create",
	"timerfd_gettime", "timerfd_settime", "times",
	// Polling, events, pipes.
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
	"epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "pause", "pipe",
	"pipe2", "poll", "ppoll", "pselect6", "select", "signalfd", "signalfd4",
	// Sockets (socket and socketpair themselves are in conditional).
	"accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt",
	"listen", "recvfrom", "recvmmsg", "recvmsg", "sendmmsg", "sendmsg", "sendto",
	"setsockopt", "shutdown",
	// System V and POSIX IPC (namespaced by the ipc namespace).
	"mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink",
	"msgctl", "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop",
	"shmat", "shmctl", "shmdt", "shmget",
	// Devices and terminals (the device cgroup and /dev decide which exist).
	"ioctl",
	// System information.
	"sysinfo", "uname",
	// x86-64 only.
	"arch_prctl", "modify_ldt", "get_thread_area", "set_thread_area",
}

// Address families socket and socketpair may use: local, IP and netlink
// (glibc's getaddrinfo, `ip`, `ss` read routes and addresses through it).
// Docker allows every family but AF_VSOCK; Cube allows these four, so the
// long tail of rarely used protocol stacks (AF_ALG, AF_RDS, AF_TIPC, AF_CAN,
// AF_VSOCK, AF_XDP, AF_PACKET, ...) is out of reach. AF_PACKET needs
// CAP_NET_RAW, which a sandbox lacks anyway.
var socketFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// Personalities as in Docker: PER_LINUX, PER_LINUX32, UNAME26 and both, and
// the query 0xffffffff. ADDR_NO_RANDOMIZE (setarch -R) is refused.
var personalities = []uint32{0, 0x8, 0x20000, 0x20008, 0xffffffff}

// cloneNamespaces are the clone flags that make namespaces: clone is
// allowed without any of them (Docker's mask 0x7e020000). A new user
// namespace would hand its creator every capability over fresh mount and
// network namespaces, a large kernel attack surface; the others need
// CAP_SYS_ADMIN, which a sandbox lacks. Cube's own namespaces are all made
// before the filter is installed (it is sandbox-init's last step before
// exec, see nsrt/harden.go).
const cloneNamespaces = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
	unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP

// unshareNamespaces adds CLONE_NEWTIME (0x80), which unshare takes but
// clone reads as part of the exit signal.
const unshareNamespaces = cloneNamespaces | unix.CLONE_NEWTIME

// conditional are the syscalls allowed only for some argument values.
var conditional = []Cond{
	{Name: "clone", Arg: 0, MaskClear: cloneNamespaces},
	// Docker refuses unshare without CAP_SYS_ADMIN; Cube lets through
	// unshare of per-process state (CLONE_FILES, CLONE_FS, CLONE_SYSVSEM).
	{Name: "unshare", Arg: 0, MaskClear: unshareNamespaces},
	{Name: "socket", Arg: 0, OneOf: socketFamilies},
	{Name: "socketpair", Arg: 0, OneOf: socketFamilies},
	{Name: "personality", Arg: 0, OneOf: personalities},
}

// errnos are the syscalls refused with an errno other than EPERM.
var errnos = map[string]unix.Errno{
	// clone3 passes its flags in memory, out of the filter's reach; ENOSYS
	// makes glibc and Go fall back to clone, whose flags are checked.
	"clone3": unix.ENOSYS,
}

// Refused on purpose although a container runtime might allow them; the
// policy test checks none of these creeps into the lists above:
//   - io_uring_setup, io_uring_enter, io_uring_register: operations run
//     without passing through this filter (Docker allowed them until 25.0).
//   - name_to_handle_at, open_by_handle_at: file handles ("shocker").
//   - kcmp, pidfd_getfd, process_madvise: CAP_SYS_PTRACE in Docker.
//   - clock_adjtime, settimeofday, clock_settime: clocks are not namespaced.
//   - get_mempolicy, mbind, set_mempolicy*, migrate_pages, move_pages:
//     CAP_SYS_NICE in Docker.
//   - userfaultfd, bpf, perf_event_open, keyctl, add_key, request_key,
//     mount APIs, setns, fanotify_init, syslog, *_module, kexec_*, reboot,
//     swapon/off, acct, quotactl*, sethostname, setdomainname, vhangup,
//     iopl, ioperm, statmount, listmount, listns, lsm_*, uretprobe, ...
var refusedOnPurpose = []string{
	"io_uring_setup", "io_uring_enter", "io_uring_register", "name_to_handle_at",
	"open_by_handle_at", "kcmp", "pidfd_getfd", "process_madvise", "clock_adjtime",
	"settimeofday", "clock_settime", "get_mempolicy", "mbind", "set_mempolicy",
	"set_mempolicy_home_node", "migrate_pages", "move_pages", "userfaultfd", "bpf",
	"perf_event_open", "keyctl", "add_key", "request_key", "mount", "umount2", "pivot_root",
	"open_tree", "open_tree_attr", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
	"mount_setattr", "setns", "fanotify_init", "syslog", "init_module", "finit_module",
	"delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
	"quotactl", "quotactl_fd", "sethostname", "setdomainname", "vhangup", "iopl", "ioperm",
	"statmount", "listmount", "listns", "lookup_dcookie", "uselib", "ustat", "sysfs",
	"_sysctl", "nfsservctl", "create_module", "get_kernel_syms", "query_module",
	"lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules", "uretprobe",
}

// DefaultPolicy is the sandbox profile.
func DefaultPolicy() Policy {
	return Policy{Allow: allowed, Cond: conditional, Errno: errnos}
}
