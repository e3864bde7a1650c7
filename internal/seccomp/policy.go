package seccomp

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Policy says which syscalls a sandbox may make; anything else fails with
// EPERM, and a syscall of a foreign ABI kills the process.
type Policy struct {
	Allow []string              // allowed with any arguments
	Cond  []Cond                // allowed when their argument condition holds, else EPERM
	Errno map[string]unix.Errno // refused with this errno instead of EPERM
}

// Cond allows a syscall only for some values of one argument. Only the low
// 32 bits of the argument are inspected: the flags and enums these rules
// look at are 32-bit in the kernel (clone and unshare flags, address
// families, personalities), so the kernel ignores the high bits as well.
type Cond struct {
	Name string
	Arg  int // argument index, 0..5
	// MaskClear, when not zero, allows calls whose argument has none of
	// these bits set.
	MaskClear uint32
	// OneOf, when not empty, allows calls whose argument is one of these.
	OneOf []uint32
}

// holds reports whether the condition allows argument value v.
func (c Cond) holds(v uint32) bool {
	if c.MaskClear != 0 {
		return v&c.MaskClear == 0
	}
	return slices.Contains(c.OneOf, v)
}

// WithAllowed returns p with names added to the unconditional allowlist
// (a template that needs more; see docs/security.md).
func (p Policy) WithAllowed(names ...string) Policy {
	p.Allow = append(slices.Clip(p.Allow), names...)
	return p
}

// Arch is what the filter needs to know about one architecture.
type Arch struct {
	GOARCH string
	Audit  uint32 // AUDIT_ARCH_* of the native 64-bit ABI
	// Names returns the map of syscall numbers to names, built on first use.
	Names func() map[uint32]string
	// X32 says syscall numbers with bit 30 set belong to a second ABI on
	// the same audit arch (x32 on x86_64); they kill the process.
	X32 bool
}

//go:generate sh mknames.sh

// Arches are the architectures Cube builds filters for.
var Arches = map[string]Arch{
	"amd64": {GOARCH: "amd64", Audit: unix.AUDIT_ARCH_X86_64, Names: sync.OnceValue(amd64Names), X32: true},
	"arm64": {GOARCH: "arm64", Audit: unix.AUDIT_ARCH_AARCH64, Names: sync.OnceValue(arm64Names)},
}

// NativeArch is the architecture Cube runs on.
func NativeArch() (Arch, error) {
	a, ok := Arches[runtime.GOARCH]
	if !ok {
		return Arch{}, fmt.Errorf("seccomp: architecture %s is not supported: %w", runtime.GOARCH, errdefs.ErrUnavailable)
	}
	return a, nil
}

// Name returns the name of syscall nr ("" when unknown).
func (a Arch) Name(nr uint32) string { return a.Names()[nr] }

// numbers maps names to numbers.
func (a Arch) numbers() map[string]uint32 {
	names := a.Names()
	m := make(map[string]uint32, len(names))
	for nr, name := range names {
		m[name] = nr
	}
	return m
}

// Verdict is a filter's answer: a SECCOMP_RET_* value with its data.
type Verdict uint32

const (
	Allow Verdict = unix.SECCOMP_RET_ALLOW
	Kill  Verdict = unix.SECCOMP_RET_KILL_PROCESS
)

// Errno is the verdict that fails a syscall with e.
func Errno(e unix.Errno) Verdict {
	return Verdict(unix.SECCOMP_RET_ERRNO | uint32(e)&unix.SECCOMP_RET_DATA)
}

func (v Verdict) String() string {
	switch {
	case v == Allow:
		return "allow"
	case v == Kill:
		return "kill"
	case uint32(v)&unix.SECCOMP_RET_ACTION_FULL == unix.SECCOMP_RET_ERRNO:
		return "errno " + unix.ErrnoName(unix.Errno(uint32(v)&unix.SECCOMP_RET_DATA))
	}
	return fmt.Sprintf("%#x", uint32(v))
}

// resolved is a policy in syscall numbers of one architecture.
type resolved struct {
	allow map[uint32]bool
	cond  map[uint32]Cond
	errno map[uint32]unix.Errno
}

// resolve looks up the policy's names on arch; names the architecture
// lacks are skipped, names no supported architecture knows are an error
// (a typo would otherwise silently allow nothing).
func (p Policy) resolve(arch Arch) (resolved, error) {
	nums := arch.numbers()
	r := resolved{allow: map[uint32]bool{}, cond: map[uint32]Cond{}, errno: map[uint32]unix.Errno{}}
	lookup := func(name string) (uint32, bool, error) {
		if nr, ok := nums[name]; ok {
			return nr, true, nil
		}
		if !knownName(name) {
			return 0, false, fmt.Errorf("seccomp: unknown syscall %q: %w", name, errdefs.ErrInvalidArgument)
		}
		return 0, false, nil
	}
	for _, c := range p.Cond {
		if c.Arg < 0 || c.Arg > 5 {
			return r, fmt.Errorf("seccomp: rule %s: argument index %d out of range: %w", c.Name, c.Arg, errdefs.ErrInvalidArgument)
		}
		if (c.MaskClear == 0) == (len(c.OneOf) == 0) {
			return r, fmt.Errorf("seccomp: rule %s needs exactly one of MaskClear and OneOf: %w", c.Name, errdefs.ErrInvalidArgument)
		}
		nr, ok, err := lookup(c.Name)
		if err != nil {
			return r, err
		}
		if ok {
			r.cond[nr] = c
		}
	}
	for name, e := range p.Errno {
		if e == 0 || e > unix.SECCOMP_RET_DATA {
			return r, fmt.Errorf("seccomp: rule %s: bad errno %d: %w", name, e, errdefs.ErrInvalidArgument)
		}
		nr, ok, err := lookup(name)
		if err != nil {
			return r, err
		}
		if ok {
			r.errno[nr] = e
		}
	}
	for _, name := range p.Allow {
		nr, ok, err := lookup(name)
		if err != nil {
			return r, err
		}
		if !ok {
			continue
		}
		// An unconditional allow (a template's extra) wins over a rule.
		delete(r.cond, nr)
		delete(r.errno, nr)
		r.allow[nr] = true
	}
	return r, nil
}

// knownName says whether any supported architecture has the syscall.
func knownName(name string) bool {
	for _, a := range Arches {
		for _, n := range a.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

// decide is the policy's answer, computed directly (not through BPF): the
// reference the compiled filter is tested against. args are the low 32
// bits of the syscall's arguments.
func (r resolved) decide(arch Arch, auditArch, nr uint32, args [6]uint32) Verdict {
	if auditArch != arch.Audit {
		return Kill
	}
	// Numbers from the x32 bit up are x32 calls or invalid (as libseccomp
	// does); -1 is a tracer's "skip this call" and gets the usual EPERM.
	if arch.X32 && nr >= x32SyscallBit && nr != ^uint32(0) {
		return Kill
	}
	if c, ok := r.cond[nr]; ok {
		if c.holds(args[c.Arg]) {
			return Allow
		}
		return Errno(unix.EPERM)
	}
	if e, ok := r.errno[nr]; ok {
		return Errno(e)
	}
	if r.allow[nr] {
		return Allow
	}
	return Errno(unix.EPERM)
}
