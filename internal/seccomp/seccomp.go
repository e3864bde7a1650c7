// Package seccomp builds and installs the classic-BPF seccomp filter that
// sandbox processes run under: default allow, with a deny list of the
// syscalls container runtimes deny by default (kernel modules, kexec, bpf,
// perf, keyrings, mounts, namespaces of new users, clock setting, ...).
// Denied syscalls fail with EPERM (clone3 with ENOSYS, so that libc falls
// back to clone, whose flags the filter can inspect); a syscall of a foreign
// architecture or ABI (i386, x32 on x86_64) kills the process.
package seccomp

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Rule denies one syscall.
type Rule struct {
	Name  string     // for documentation and error messages
	Nr    uint32     // syscall number on the native architecture
	Errno unix.Errno // returned instead of running the syscall
	// ArgMask, when not zero, restricts the rule to calls whose argument
	// Arg has any of these bits set (only the low 32 bits of the argument
	// are inspected; flags of clone and unshare fit there).
	Arg     int
	ArgMask uint32
}

// offsets into struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16 // args[i] at offArgs + 8*i, low 32 bits first (little endian)
)

// x32SyscallBit marks x32-ABI syscall numbers on x86_64.
const x32SyscallBit = 0x40000000

// retErrno is the filter's return value for failing with errno.
func retErrno(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e)&unix.SECCOMP_RET_DATA }

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

const (
	ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	jsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	retK   = unix.BPF_RET | unix.BPF_K
)

// Build compiles rules into a filter program for the native architecture:
// default allow, each rule returning its errno. Rules with an argument mask
// are checked before unconditional ones for the same syscall never matter:
// the first matching rule wins.
func Build(rules []Rule) ([]unix.SockFilter, error) {
	arch, ok := nativeArch()
	if !ok {
		return nil, fmt.Errorf("seccomp: architecture %s is not supported: %w", runtime.GOARCH, errdefs.ErrUnavailable)
	}
	prog := []unix.SockFilter{
		stmt(ldAbsW, offArch),
		jump(jeqK, arch, 1, 0),
		stmt(retK, unix.SECCOMP_RET_KILL_PROCESS),
		stmt(ldAbsW, offNr),
	}
	if runtime.GOARCH == "amd64" {
		prog = append(prog,
			jump(jgeK, x32SyscallBit, 0, 1),
			stmt(retK, unix.SECCOMP_RET_KILL_PROCESS))
	}
	for _, r := range rules {
		if r.Errno == 0 {
			return nil, fmt.Errorf("seccomp: rule %s has no errno: %w", r.Name, errdefs.ErrInvalidArgument)
		}
		if r.ArgMask == 0 {
			// nr == r.Nr ? return errno : next rule
			prog = append(prog,
				jump(jeqK, r.Nr, 0, 1),
				stmt(retK, retErrno(r.Errno)))
			continue
		}
		if r.Arg < 0 || r.Arg > 5 {
			return nil, fmt.Errorf("seccomp: rule %s: argument index %d out of range: %w", r.Name, r.Arg, errdefs.ErrInvalidArgument)
		}
		// nr == r.Nr ? (args[Arg] & mask ? errno : reload nr) : next rule
		prog = append(prog,
			jump(jeqK, r.Nr, 0, 4),
			stmt(ldAbsW, uint32(offArgs+8*r.Arg)),
			jump(jsetK, r.ArgMask, 0, 1),
			stmt(retK, retErrno(r.Errno)),
			stmt(ldAbsW, offNr))
	}
	prog = append(prog, stmt(retK, unix.SECCOMP_RET_ALLOW))
	if len(prog) > 4096 { // BPF_MAXINSNS
		return nil, fmt.Errorf("seccomp: filter of %d instructions is too long: %w", len(prog), errdefs.ErrInvalidArgument)
	}
	return prog, nil
}

// Install loads prog for every thread of the calling process (TSYNC); the
// filter is inherited across fork and exec and cannot be removed. The caller
// must have set no_new_privs (see SetNoNewPrivs) or hold CAP_SYS_ADMIN.
func Install(prog []unix.SockFilter) error {
	if len(prog) == 0 {
		return fmt.Errorf("seccomp: empty filter: %w", errdefs.ErrInvalidArgument)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("seccomp: install filter: %w", errno)
	}
	return nil
}

// SetNoNewPrivs sets no_new_privs on the calling thread: execve can no
// longer grant privileges (setuid bits and file capabilities are ignored).
// It is inherited by children and cannot be unset.
func SetNoNewPrivs() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	return nil
}

// InstallDefault builds the filter of DefaultRules and installs it.
func InstallDefault() error {
	prog, err := Build(DefaultRules())
	if err != nil {
		return err
	}
	return Install(prog)
}
