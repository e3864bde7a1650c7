package seccomp

import "golang.org/x/sys/unix"

// cloneFlagsArg is the index of clone's flags argument.
const cloneFlagsArg = 0

func nativeArch() (uint32, bool) { return unix.AUDIT_ARCH_AARCH64, true }

// archRules are the arm64-only syscalls of the profile.
func archRules() []Rule {
	return []Rule{
		deny("nfsservctl", unix.SYS_NFSSERVCTL),
		deny("vhangup", unix.SYS_VHANGUP),
	}
}
