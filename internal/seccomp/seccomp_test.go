package seccomp

import (
	"encoding/binary"
	"slices"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData is struct seccomp_data as the filter sees it on a
// little-endian machine. The kernel loads 32-bit words in host order, the
// x/net/bpf VM in network order, so each word is stored big-endian at the
// offset where the kernel finds it.
func seccompData(arch, nr uint32, args [6]uint32) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], nr)
	binary.BigEndian.PutUint32(b[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], a)
		binary.BigEndian.PutUint32(b[16+8*i+4:], 0xdeadbeef) // high bits are never looked at
	}
	return b
}

// vm loads the filter of p for arch into the x/net/bpf interpreter.
func vm(t *testing.T, arch Arch, p Policy) *bpf.VM {
	t.Helper()
	prog, err := Build(arch, p)
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

func run(t *testing.T, v *bpf.VM, arch, nr uint32, args [6]uint32) Verdict {
	t.Helper()
	got, err := v.Run(seccompData(arch, nr, args))
	if err != nil {
		t.Fatalf("run nr %d: %v", nr, err)
	}
	return Verdict(got)
}

// interesting argument values: each condition's own values and mask bits,
// their neighbours, and unrelated ones.
func interesting(p Policy) []uint32 {
	vals := []uint32{0, 1, 2, 0x11, 0x40, 0x80, 0x100, 0x7fffffff, 0xfffffffe, 0xffffffff}
	for _, c := range p.Cond {
		for _, v := range c.OneOf {
			vals = append(vals, v, v+1, v-1)
		}
		for bit := uint32(1); bit != 0; bit <<= 1 {
			vals = append(vals, bit, bit|uint32(unix.SIGCHLD))
		}
	}
	slices.Sort(vals)
	return slices.Compact(vals)
}

// TestEverySyscallMatchesPolicy enumerates every syscall number of each
// architecture (and the numbers around and past them) and checks that the
// compiled filter answers what the policy says, for each argument value
// of interest; on amd64 every x32 number, and every number under a foreign
// audit arch, is killed.
func TestEverySyscallMatchesPolicy(t *testing.T) {
	p := DefaultPolicy()
	vals := interesting(p)
	for _, arch := range Arches {
		t.Run(arch.GOARCH, func(t *testing.T) {
			v := vm(t, arch, p)
			r, err := p.resolve(arch)
			if err != nil {
				t.Fatal(err)
			}
			maxNr := slices.Max(sortedKeys(arch.Names()))
			counts := map[Verdict]int{}
			for nr := uint32(0); nr <= maxNr+64; nr++ {
				var args [6]uint32
				want := r.decide(arch, arch.Audit, nr, args)
				if got := run(t, v, arch.Audit, nr, args); got != want {
					t.Errorf("%s (%d): filter says %s, policy %s", arch.Name(nr), nr, got, want)
				}
				counts[want]++
				if _, ok := r.cond[nr]; ok {
					for _, val := range vals {
						for i := range args {
							var a [6]uint32
							a[i] = val
							want := r.decide(arch, arch.Audit, nr, a)
							if got := run(t, v, arch.Audit, nr, a); got != want {
								t.Errorf("%s arg%d=%#x: filter says %s, policy %s", arch.Name(nr), i, val, got, want)
							}
						}
					}
				}
				// Foreign ABIs: i386 / AArch32, and x32.
				for _, foreign := range []uint32{unix.AUDIT_ARCH_I386, unix.AUDIT_ARCH_ARM, unix.AUDIT_ARCH_X86_64, unix.AUDIT_ARCH_AARCH64} {
					if foreign == arch.Audit {
						continue
					}
					if got := run(t, v, foreign, nr, args); got != Kill {
						t.Errorf("arch %#x nr %d: filter says %s, want kill", foreign, nr, got)
					}
				}
				if arch.X32 {
					if got := run(t, v, arch.Audit, nr|x32SyscallBit, args); got != Kill {
						t.Errorf("x32 %d: filter says %s, want kill", nr, got)
					}
				}
			}
			for _, nr := range []uint32{0x3fffffff, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff} {
				want := r.decide(arch, arch.Audit, nr, [6]uint32{})
				if got := run(t, v, arch.Audit, nr, [6]uint32{}); got != want {
					t.Errorf("nr %#x: filter says %s, policy %s", nr, got, want)
				}
			}
			t.Logf("%s: %d allowed, %d EPERM (incl. conditional), %d other", arch.GOARCH,
				counts[Allow], counts[Errno(unix.EPERM)], counts[Errno(unix.ENOSYS)])
		})
	}
}

// TestPolicyDecisions pins the policy itself: what workloads need is
// allowed, what the issue names is refused.
func TestPolicyDecisions(t *testing.T) {
	p := DefaultPolicy()
	eperm := Errno(unix.EPERM)
	type tc struct {
		name string
		args [6]uint32
		want Verdict
	}
	common := []tc{
		{"read", [6]uint32{}, Allow},
		{"getrandom", [6]uint32{}, Allow},
		{"execve", [6]uint32{}, Allow},
		{"futex", [6]uint32{}, Allow},
		{"ptrace", [6]uint32{}, Allow},
		{"chroot", [6]uint32{}, Allow},
		{"clone", [6]uint32{uint32(unix.SIGCHLD)}, Allow},
		{"clone", [6]uint32{unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND | unix.CLONE_SETTLS}, Allow},
		{"clone", [6]uint32{unix.CLONE_NEWUSER | uint32(unix.SIGCHLD)}, eperm},
		{"clone", [6]uint32{unix.CLONE_NEWNET}, eperm},
		{"clone3", [6]uint32{}, Errno(unix.ENOSYS)},
		{"unshare", [6]uint32{unix.CLONE_FILES}, Allow},
		{"unshare", [6]uint32{unix.CLONE_NEWUSER}, eperm},
		{"unshare", [6]uint32{unix.CLONE_NEWTIME}, eperm},
		{"unshare", [6]uint32{unix.CLONE_NEWNS}, eperm},
		{"socket", [6]uint32{unix.AF_INET}, Allow},
		{"socket", [6]uint32{unix.AF_INET6}, Allow},
		{"socket", [6]uint32{unix.AF_UNIX}, Allow},
		{"socket", [6]uint32{unix.AF_NETLINK}, Allow},
		{"socket", [6]uint32{unix.AF_VSOCK}, eperm},
		{"socket", [6]uint32{unix.AF_ALG}, eperm},
		{"socket", [6]uint32{unix.AF_PACKET}, eperm},
		{"socketpair", [6]uint32{unix.AF_UNIX}, Allow},
		{"socketpair", [6]uint32{unix.AF_TIPC}, eperm},
		{"personality", [6]uint32{0xffffffff}, Allow},
		{"personality", [6]uint32{0}, Allow},
		{"personality", [6]uint32{0x0040000 /* ADDR_NO_RANDOMIZE */}, eperm},
	}
	for _, name := range []string{"userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "kcmp",
		"open_by_handle_at", "name_to_handle_at", "bpf", "mount", "setns", "keyctl", "perf_event_open",
		"init_module", "kexec_load", "settimeofday", "pidfd_getfd", "statmount", "listmount"} {
		common = append(common, tc{name, [6]uint32{}, eperm})
	}
	for _, arch := range Arches {
		v := vm(t, arch, p)
		nums := arch.numbers()
		cases := slices.Clone(common)
		if arch.GOARCH == "amd64" {
			cases = append(cases, tc{"arch_prctl", [6]uint32{}, Allow}, tc{"open", [6]uint32{}, Allow},
				tc{"fork", [6]uint32{}, Allow}, tc{"iopl", [6]uint32{}, eperm}, tc{"_sysctl", [6]uint32{}, eperm})
		}
		for _, c := range cases {
			nr, ok := nums[c.name]
			if !ok {
				t.Fatalf("%s: no syscall %s", arch.GOARCH, c.name)
			}
			if got := run(t, v, arch.Audit, nr, c.args); got != c.want {
				t.Errorf("%s: %s(%#x): filter says %s, want %s", arch.GOARCH, c.name, c.args[0], got, c.want)
			}
		}
	}
}

// TestListsAreConsistent catches typos and contradictions in rules.go.
func TestListsAreConsistent(t *testing.T) {
	seen := map[string]bool{}
	for _, name := range allowed {
		if seen[name] {
			t.Errorf("%s allowed twice", name)
		}
		seen[name] = true
		if !knownName(name) {
			t.Errorf("allowed %q is no syscall of amd64 or arm64", name)
		}
	}
	for _, name := range refusedOnPurpose {
		if !knownName(name) {
			t.Errorf("refused %q is no syscall of amd64 or arm64", name)
		}
		if seen[name] {
			t.Errorf("%s is both allowed and refused on purpose", name)
		}
		for _, c := range conditional {
			if c.Name == name {
				t.Errorf("%s is conditional and refused on purpose", name)
			}
		}
	}
	for _, c := range conditional {
		if seen[c.Name] {
			t.Errorf("%s is both allowed and conditional", c.Name)
		}
	}
	// Every architecture must be able to start a Go or C program.
	for _, arch := range Arches {
		nums := arch.numbers()
		r, err := DefaultPolicy().resolve(arch)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"execve", "mmap", "rt_sigreturn", "exit_group", "openat", "set_tid_address",
			"rseq", "prlimit64", "getrandom", "sched_getaffinity", "sigaltstack", "rt_sigprocmask"} {
			if !r.allow[nums[name]] {
				t.Errorf("%s: %s not allowed", arch.GOARCH, name)
			}
		}
	}
}

func TestExtraAllowed(t *testing.T) {
	arch := Arches["amd64"]
	p := DefaultPolicy().WithAllowed("kcmp", "socket")
	v := vm(t, arch, p)
	nums := arch.numbers()
	if got := run(t, v, arch.Audit, nums["kcmp"], [6]uint32{}); got != Allow {
		t.Errorf("extra kcmp: %s", got)
	}
	if got := run(t, v, arch.Audit, nums["socket"], [6]uint32{unix.AF_VSOCK}); got != Allow {
		t.Errorf("extra socket (unconditional): %s", got)
	}
	if got := run(t, vm(t, arch, DefaultPolicy()), arch.Audit, nums["kcmp"], [6]uint32{}); got != Errno(unix.EPERM) {
		t.Errorf("default kcmp after WithAllowed: %s (WithAllowed changed the default lists?)", got)
	}
	if _, err := Build(arch, DefaultPolicy().WithAllowed("no_such_call")); err == nil {
		t.Error("unknown extra syscall accepted")
	}
}

func TestBuildRejectsBadRules(t *testing.T) {
	arch := Arches["amd64"]
	bad := []Policy{
		{Cond: []Cond{{Name: "socket", Arg: 6, OneOf: []uint32{1}}}},
		{Cond: []Cond{{Name: "socket", Arg: 0}}},
		{Cond: []Cond{{Name: "socket", Arg: 0, MaskClear: 1, OneOf: []uint32{1}}}},
		{Errno: map[string]unix.Errno{"clone3": 0}},
		{Allow: []string{"opne"}},
	}
	for i, p := range bad {
		if _, err := Build(arch, p); err == nil {
			t.Errorf("bad policy %d accepted", i)
		}
	}
	if err := Install(nil, false); err == nil {
		t.Error("empty filter installed")
	}
}

func TestProgramIsCompiledOnce(t *testing.T) {
	if _, err := NativeArch(); err != nil {
		t.Skip(err)
	}
	a, err := Program(Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Program(Options{Log: true})
	if &a[0] != &b[0] {
		t.Error("default program compiled twice")
	}
	c, err := Program(Options{ExtraAllowed: []string{"kcmp"}})
	if err != nil {
		t.Fatal(err)
	}
	if &c[0] == &a[0] {
		t.Error("extra syscalls share the default program")
	}
	t.Logf("default program: %d instructions", len(a))
}

func BenchmarkBuild(b *testing.B) {
	arch := Arches["amd64"]
	for b.Loop() {
		if _, err := Build(arch, DefaultPolicy()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLogModeSameAnswers evaluates log mode's two filters as the kernel
// does (the stricter action wins; on a tie the filter installed last) and
// checks every answer equals the single filter's, and that only refusals
// other than the expected ones (clone3) come from the logged filter.
func TestLogModeSameAnswers(t *testing.T) {
	arch, err := NativeArch()
	if err != nil {
		t.Skip(err)
	}
	quiet, logged, err := logPrograms(Options{})
	if err != nil {
		t.Fatal(err)
	}
	load := func(prog []unix.SockFilter) *bpf.VM {
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
	qv, lv, dv := load(quiet), load(logged), vm(t, arch, DefaultPolicy())
	action := func(v Verdict) int32 { return int32(uint32(v) & unix.SECCOMP_RET_ACTION_FULL) }
	clone3 := arch.numbers()["clone3"]
	for nr := uint32(0); nr < 600; nr++ {
		for _, a0 := range interesting(DefaultPolicy()) {
			args := [6]uint32{a0}
			q, l, d := run(t, qv, arch.Audit, nr, args), run(t, lv, arch.Audit, nr, args), run(t, dv, arch.Audit, nr, args)
			got, fromLogged := l, true // the logged filter is installed last: evaluated first
			if action(q) < action(l) {
				got, fromLogged = q, false
			}
			if got != d {
				t.Fatalf("%s(%#x): log mode answers %s, default %s", arch.Name(nr), a0, got, d)
			}
			if wantLogged := d != Allow && nr != clone3; (fromLogged && got != Allow) != wantLogged {
				t.Fatalf("%s(%#x): %s logged=%v, want logged=%v", arch.Name(nr), a0, got, fromLogged && got != Allow, wantLogged)
			}
		}
	}
	if got := run(t, qv, unix.AUDIT_ARCH_I386, 1, [6]uint32{}); got != Allow {
		t.Errorf("quiet filter on i386: %s, want allow (the logged one kills)", got)
	}
	if got := run(t, lv, unix.AUDIT_ARCH_I386, 1, [6]uint32{}); got != Kill {
		t.Errorf("logged filter on i386: %s, want kill", got)
	}
}
