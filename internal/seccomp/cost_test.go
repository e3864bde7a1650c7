package seccomp

import (
	"fmt"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// execute is a second, tiny interpreter for the instructions Build emits
// (ld abs, jeq/jge/jgt/jset k, ret k). It reads struct seccomp_data as the
// kernel does and counts the instructions run: the filter's cost per call
// when the kernel's action cache (>= 5.11, constant-allow numbers only)
// does not spare it.
func execute(prog []unix.SockFilter, arch, nr uint32, args [6]uint32) (Verdict, int, error) {
	var a uint32
	for pc, steps := 0, 1; pc < len(prog); pc, steps = pc+1, steps+1 {
		f := prog[pc]
		switch f.Code {
		case ldAbsW:
			switch {
			case f.K == offNr:
				a = nr
			case f.K == offArch:
				a = arch
			case f.K >= offArgs && f.K < offArgs+48 && (f.K-offArgs)%8 == 0:
				a = args[(f.K-offArgs)/8]
			default:
				return 0, steps, fmt.Errorf("pc %d: load of offset %d", pc, f.K)
			}
			continue
		case retK:
			return Verdict(f.K), steps, nil
		}
		var cond bool
		switch f.Code {
		case jeqK:
			cond = a == f.K
		case jgeK:
			cond = a >= f.K
		case jgtK:
			cond = a > f.K
		case jsetK:
			cond = a&f.K != 0
		default:
			return 0, steps, fmt.Errorf("pc %d: opcode %#x", pc, f.Code)
		}
		if cond {
			pc += int(f.Jt)
		} else {
			pc += int(f.Jf)
		}
	}
	return 0, 0, fmt.Errorf("fell off the program")
}

// denyListProgram is the shape of the filter the allowlist replaced
// (44c321c): a compare per denied number, default allow.
func denyListProgram(arch Arch) []unix.SockFilter {
	nums := arch.numbers()
	prog := []unix.SockFilter{stmt(ldAbsW, offArch), jump(jeqK, arch.Audit, 1, 0), ret(Kill), stmt(ldAbsW, offNr)}
	if arch.X32 {
		prog = append(prog, jump(jgeK, x32SyscallBit, 0, 1), ret(Kill))
	}
	for _, name := range []string{"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
		"bpf", "perf_event_open", "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd",
		"lookup_dcookie", "syslog", "userfaultfd", "fanotify_init", "keyctl", "add_key", "request_key",
		"settimeofday", "clock_settime", "clock_adjtime", "mount", "umount2", "pivot_root", "open_tree",
		"move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "name_to_handle_at",
		"open_by_handle_at", "setns", "unshare", "clone", "clone3", "io_uring_setup", "io_uring_enter",
		"io_uring_register", "iopl", "ioperm", "create_module", "get_kernel_syms", "query_module",
		"nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "vhangup"} {
		nr, ok := nums[name]
		if !ok {
			continue
		}
		switch name {
		case "clone", "unshare":
			prog = append(prog, jump(jeqK, nr, 0, 4), stmt(ldAbsW, offArgs), jump(jsetK, unshareNamespaces, 0, 1),
				ret(Errno(unix.EPERM)), stmt(ldAbsW, offNr))
		default:
			prog = append(prog, jump(jeqK, nr, 0, 1), ret(Errno(unix.EPERM)))
		}
	}
	return append(prog, ret(Allow))
}

// TestInterpretersAgree runs every syscall number through both
// interpreters (x/net/bpf's VM and execute) and reports what each filter
// costs per call, in instructions run.
func TestInterpretersAgree(t *testing.T) {
	for _, arch := range Arches {
		prog, err := Build(arch, DefaultPolicy())
		if err != nil {
			t.Fatal(err)
		}
		v := vm(t, arch, DefaultPolicy())
		maxNr := slices.Max(sortedKeys(arch.Names()))
		var steps, maxSteps int
		for nr := uint32(0); nr <= maxNr; nr++ {
			got, n, err := execute(prog, arch.Audit, nr, [6]uint32{})
			if err != nil {
				t.Fatalf("%s %d: %v", arch.GOARCH, nr, err)
			}
			if want := run(t, v, arch.Audit, nr, [6]uint32{}); got != want {
				t.Fatalf("%s %s: execute says %s, x/net/bpf %s", arch.GOARCH, arch.Name(nr), got, want)
			}
			steps += n
			maxSteps = max(maxSteps, n)
		}
		deny := denyListProgram(arch)
		cost := func(p []unix.SockFilter, name string, a0 uint32) int {
			_, n, err := execute(p, arch.Audit, arch.numbers()[name], [6]uint32{a0})
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		t.Logf("%s: allowlist %d instructions, mean %.1f / max %d run per call over all numbers; "+
			"run per call, allowlist vs deny list: getppid %d vs %d, socket(AF_UNIX) %d vs %d, clone %d vs %d, kcmp %d vs %d",
			arch.GOARCH, len(prog), float64(steps)/float64(maxNr+1), maxSteps,
			cost(prog, "getppid", 0), cost(deny, "getppid", 0), cost(prog, "socket", 1), cost(deny, "socket", 1),
			cost(prog, "clone", uint32(unix.SIGCHLD)), cost(deny, "clone", uint32(unix.SIGCHLD)),
			cost(prog, "kcmp", 0), cost(deny, "kcmp", 0))
	}
}
