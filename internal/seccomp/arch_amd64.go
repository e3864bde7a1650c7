package seccomp

import "golang.org/x/sys/unix"

// cloneFlagsArg is the index of clone's flags argument.
const cloneFlagsArg = 0

func nativeArch() (uint32, bool) { return unix.AUDIT_ARCH_X86_64, true }

// archRules are the x86_64-only syscalls of the profile.
func archRules() []Rule {
	return []Rule{
		deny("iopl", unix.SYS_IOPL),
		deny("ioperm", unix.SYS_IOPERM),
		deny("create_module", unix.SYS_CREATE_MODULE),
		deny("get_kernel_syms", unix.SYS_GET_KERNEL_SYMS),
		deny("query_module", unix.SYS_QUERY_MODULE),
		deny("nfsservctl", unix.SYS_NFSSERVCTL),
		deny("uselib", unix.SYS_USELIB),
		deny("ustat", unix.SYS_USTAT),
		deny("sysfs", unix.SYS_SYSFS),
		deny("_sysctl", unix.SYS__SYSCTL),
		deny("vhangup", unix.SYS_VHANGUP),
	}
}
