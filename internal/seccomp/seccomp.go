// Package seccomp builds and installs the classic-BPF seccomp filter that
// sandbox processes run under: an allowlist (rules.go) in the spirit of
// Docker's default profile. Allowed syscalls run; clone, unshare, socket,
// socketpair and personality are allowed only for some argument values;
// clone3 fails with ENOSYS (so libc falls back to clone, whose flags the
// filter can inspect); everything else fails with EPERM, so programs can
// fall back. A syscall of a foreign architecture or ABI (i386, x32 on
// x86_64, AArch32 on arm64) kills the process.
package seccomp

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// offsets into struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16 // args[i] at offArgs + 8*i, low 32 bits first (little endian)
)

// x32SyscallBit marks x32-ABI syscall numbers on x86_64.
const x32SyscallBit = 0x40000000

// maxInsns is BPF_MAXINSNS.
const maxInsns = 4096

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

func ret(v Verdict) unix.SockFilter { return stmt(retK, uint32(v)) }

const (
	ldAbsW = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	jgtK   = unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K
	jsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	retK   = unix.BPF_RET | unix.BPF_K
)

// Build compiles p into a filter program for arch:
//
//  1. a foreign audit arch, or an x32 number, kills;
//  2. each conditional and errno rule: a compare on the number, then its
//     argument test, returning;
//  3. the allowed numbers, merged into ranges and searched as a balanced
//     tree of jge/jgt: O(log n) compares. Kernels >= 5.11 skip the filter
//     altogether for numbers whose answer is a constant allow (the seccomp
//     action cache), so the common case costs nothing.
func Build(arch Arch, p Policy) ([]unix.SockFilter, error) {
	r, err := p.resolve(arch)
	if err != nil {
		return nil, err
	}
	prog := []unix.SockFilter{
		stmt(ldAbsW, offArch),
		jump(jeqK, arch.Audit, 1, 0),
		ret(Kill),
		stmt(ldAbsW, offNr),
	}
	if arch.X32 {
		// nr >= x32 bit and nr != -1 (a tracer's "skip") kills.
		prog = append(prog,
			jump(jgeK, x32SyscallBit, 0, 2),
			jump(jeqK, ^uint32(0), 1, 0),
			ret(Kill))
	}
	for _, nr := range sortedKeys(r.cond) {
		c := r.cond[nr]
		var block []unix.SockFilter
		block = append(block, stmt(ldAbsW, uint32(offArgs+8*c.Arg)))
		if c.MaskClear != 0 {
			block = append(block, jump(jsetK, c.MaskClear, 1, 0), ret(Allow), ret(Errno(unix.EPERM)))
		} else {
			n := len(c.OneOf)
			for i, v := range c.OneOf {
				// true: jump over the remaining compares and the EPERM to allow.
				block = append(block, jump(jeqK, v, uint8(n-i), 0))
			}
			block = append(block, ret(Errno(unix.EPERM)), ret(Allow))
		}
		if len(block) > 255 {
			return nil, fmt.Errorf("seccomp: rule %s is too long: %w", c.Name, errdefs.ErrInvalidArgument)
		}
		prog = append(prog, jump(jeqK, nr, 0, uint8(len(block))))
		prog = append(prog, block...)
	}
	for _, nr := range sortedKeys(r.errno) {
		prog = append(prog, jump(jeqK, nr, 0, 1), ret(Errno(r.errno[nr])))
	}
	tree, err := rangeTree(ranges(sortedKeys(r.allow)))
	if err != nil {
		return nil, err
	}
	prog = append(prog, tree...)
	if len(prog) > maxInsns {
		return nil, fmt.Errorf("seccomp: filter of %d instructions is too long: %w", len(prog), errdefs.ErrInvalidArgument)
	}
	return prog, nil
}

func sortedKeys[V any](m map[uint32]V) []uint32 {
	keys := make([]uint32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

type span struct{ lo, hi uint32 }

// ranges merges sorted numbers into maximal runs.
func ranges(nrs []uint32) []span {
	var out []span
	for _, nr := range nrs {
		if n := len(out); n > 0 && out[n-1].hi+1 == nr {
			out[n-1].hi = nr
			continue
		}
		out = append(out, span{nr, nr})
	}
	return out
}

// rangeTree emits code that, with the syscall number in A, allows it when
// it falls in one of rs and returns EPERM otherwise.
func rangeTree(rs []span) ([]unix.SockFilter, error) {
	switch len(rs) {
	case 0:
		return []unix.SockFilter{ret(Errno(unix.EPERM))}, nil
	case 1:
		return []unix.SockFilter{
			jump(jgtK, rs[0].hi, 2, 0),
			jump(jgeK, rs[0].lo, 0, 1),
			ret(Allow),
			ret(Errno(unix.EPERM)),
		}, nil
	}
	mid := len(rs) / 2
	left, err := rangeTree(rs[:mid])
	if err != nil {
		return nil, err
	}
	right, err := rangeTree(rs[mid:])
	if err != nil {
		return nil, err
	}
	if len(left) > 255 {
		return nil, fmt.Errorf("seccomp: allowlist tree branch of %d instructions exceeds a jump: %w", len(left), errdefs.ErrInvalidArgument)
	}
	out := append([]unix.SockFilter{jump(jgeK, rs[mid].lo, uint8(len(left)), 0)}, left...)
	return append(out, right...), nil
}

// Options are the per-sandbox choices about the filter.
type Options struct {
	// Log makes the kernel log every refused call (audit record type 1326,
	// in the kernel log when no audit daemon runs) with the caller's pid,
	// syscall and arch; refused calls still fail the same way.
	Log bool
	// ExtraAllowed are syscalls allowed on top of the default policy.
	ExtraAllowed []string
}

// defaultProgram is the default policy compiled once per process.
var defaultProgram = sync.OnceValues(func() ([]unix.SockFilter, error) {
	arch, err := NativeArch()
	if err != nil {
		return nil, err
	}
	return Build(arch, DefaultPolicy())
})

// Program returns the compiled filter for o: the default one, compiled once
// per process, unless o adds syscalls.
func Program(o Options) ([]unix.SockFilter, error) {
	if len(o.ExtraAllowed) == 0 {
		return defaultProgram()
	}
	arch, err := NativeArch()
	if err != nil {
		return nil, err
	}
	return Build(arch, DefaultPolicy().WithAllowed(o.ExtraAllowed...))
}

// CheckAllowed returns an error wrapping errdefs.ErrInvalidArgument when one
// of names is not a system call of this architecture: the check a
// template's extra syscalls get before any sandbox depends on them.
func CheckAllowed(names []string) error {
	_, err := Program(Options{ExtraAllowed: names})
	return err
}

// Install loads prog for every thread of the calling process (TSYNC); the
// filter is inherited across fork and exec and cannot be removed. With log,
// the kernel also logs every action other than allow (SECCOMP_FILTER_FLAG_LOG).
// The caller must have set no_new_privs (see SetNoNewPrivs) or hold
// CAP_SYS_ADMIN.
func Install(prog []unix.SockFilter, log bool) error {
	if len(prog) == 0 {
		return fmt.Errorf("seccomp: empty filter: %w", errdefs.ErrInvalidArgument)
	}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_TSYNC)
	if log {
		flags |= unix.SECCOMP_FILTER_FLAG_LOG
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
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

// InstallDefault installs the sandbox filter chosen by o.
//
// In log mode the policy is split in two filters so that the kernel's
// log, rate-limited, is spent on real refusals only: a first filter,
// installed without logging, answers the expected refusals (Policy.Errno:
// clone3, which glibc tries before every clone) and allows the rest; a
// second one, logged, is the policy with those calls allowed. The kernel
// runs both and takes the stricter answer, and logs it only if it came
// from the logged filter: the answers are the same as without logging.
func InstallDefault(o Options) error {
	fs, err := Filters(o)
	if err != nil {
		return err
	}
	return InstallFilters(fs)
}

// logPrograms are the two filters of log mode (see InstallDefault).
func logPrograms(o Options) (quiet, logged []unix.SockFilter, err error) {
	arch, err := NativeArch()
	if err != nil {
		return nil, nil, err
	}
	p := DefaultPolicy().WithAllowed(o.ExtraAllowed...)
	r, err := p.resolve(arch)
	if err != nil {
		return nil, nil, err
	}
	// quiet: the errno rules, everything else allowed (the logged filter
	// kills foreign ABIs).
	quiet = []unix.SockFilter{
		stmt(ldAbsW, offArch),
		jump(jeqK, arch.Audit, 1, 0),
		ret(Allow),
		stmt(ldAbsW, offNr),
	}
	var expected []string
	for _, nr := range sortedKeys(r.errno) {
		quiet = append(quiet, jump(jeqK, nr, 0, 1), ret(Errno(r.errno[nr])))
		expected = append(expected, arch.Name(nr))
	}
	quiet = append(quiet, ret(Allow))
	loud := p.WithAllowed(expected...)
	if logged, err = Build(arch, loud); err != nil {
		return nil, nil, err
	}
	return quiet, logged, nil
}
