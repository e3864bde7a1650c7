package cgroup

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// devRequest is one device access as the kernel presents it to the program.
type devRequest struct {
	Type         byte // 'c' or 'b'
	Major, Minor uint32
	Access       string // "r", "w", "rw", "m"
}

// allowedByRules is the reference semantics of an allowlist.
func allowedByRules(rules []Device, q devRequest) bool {
	for _, d := range rules {
		if (d.Type == 'a' || d.Type == q.Type) &&
			(d.Major < 0 || uint32(d.Major) == q.Major) &&
			(d.Minor < 0 || uint32(d.Minor) == q.Minor) &&
			strings.Trim(q.Access, d.Access) == "" {
			return true
		}
	}
	return false
}

// asmOf decodes insns with cilium/ebpf's asm package: an independent
// reading of the encoding the kernel gets.
func asmOf(t *testing.T, insns []bpfInsn) asm.Instructions {
	t.Helper()
	bo := binary.ByteOrder(binary.LittleEndian)
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		bo = binary.BigEndian
	}
	r := bytes.NewReader(marshalInsns(insns))
	var out asm.Instructions
	for r.Len() > 0 {
		var ins asm.Instruction
		if err := ins.Unmarshal(r, bo, "linux"); err != nil {
			t.Fatalf("decode program: %v", err)
		}
		out = append(out, ins)
	}
	return out
}

// runDeviceProgram interprets insns on q: the subset of eBPF that
// deviceProgram emits (32-bit context loads, ALU and, rsh, mov, jne, exit).
func runDeviceProgram(t *testing.T, prog []bpfInsn, q devRequest) uint64 {
	t.Helper()
	insns := asmOf(t, prog)
	typ := uint64(devcgDevChar)
	if q.Type == 'b' {
		typ = devcgDevBlock
	}
	ctx := map[int16]uint64{
		devCtxAccessType: typ | uint64(deviceAccessMask(q.Access))<<16,
		devCtxMajor:      uint64(q.Major),
		devCtxMinor:      uint64(q.Minor),
	}
	for i, ins := range insns {
		if ins.OpCode.IsDWordLoad() {
			t.Fatalf("insn %d: unexpected dword load", i)
		}
	}
	var r [11]uint64
	r[1] = 1 << 40 // "pointer" to the context
	for pc, steps := 0, 0; ; steps++ {
		if pc < 0 || pc >= len(insns) || steps > 10*len(insns) {
			t.Fatalf("pc %d out of the program after %d steps", pc, steps)
		}
		ins := insns[pc]
		pc++
		op := ins.OpCode
		src := uint64(ins.Constant)
		if op.Source() == asm.RegSource {
			src = r[ins.Src]
		}
		switch op.Class() {
		case asm.LdXClass:
			v, ok := ctx[ins.Offset]
			if ins.Src != asm.R1 || r[1] != 1<<40 || op.Size() != asm.Word || !ok {
				t.Fatalf("bad context load %v", ins)
			}
			r[ins.Dst] = v
		case asm.ALUClass, asm.ALU64Class:
			switch op.ALUOp() {
			case asm.And:
				r[ins.Dst] &= src
			case asm.RSh:
				r[ins.Dst] >>= src
			case asm.Mov:
				r[ins.Dst] = src
			default:
				t.Fatalf("unexpected ALU op %v", ins)
			}
			if op.Class() == asm.ALUClass {
				r[ins.Dst] = uint64(uint32(r[ins.Dst]))
			}
		case asm.JumpClass:
			switch op.JumpOp() {
			case asm.Exit:
				return r[0]
			case asm.JNE:
				// A forward jump to the start of a block (checked by
				// TestDeviceProgramListing) or past the end (caught above).
				if ins.Offset <= 0 {
					t.Fatalf("insn %d: jump offset %d", pc-1, ins.Offset)
				}
				if r[ins.Dst] != src {
					pc += int(ins.Offset)
				}
			default:
				t.Fatalf("unexpected jump %v", ins)
			}
		default:
			t.Fatalf("unexpected instruction %v", ins)
		}
	}
}

// ruleSets are the allowlists the program tests use.
var ruleSets = map[string][]Device{
	"sandbox": SandboxDevices,
	"wildcards": {
		{'c', 1, -1, "rwm"},
		{'a', 7, -1, "r"},
		{'b', -1, 3, "w"},
	},
	"all-then-more": {{'c', 1, 3, "r"}, {'a', -1, -1, "rwm"}, {'b', 8, 0, "r"}},
	"deny-all":      {},
	"mknod-only":    {{'b', 8, -1, "m"}},
}

func TestDeviceProgramListing(t *testing.T) {
	insns, err := deviceProgram([]Device{{'c', 1, 3, "rw"}, {'a', -1, -1, "rwm"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ins := range asmOf(t, insns) {
		got = append(got, fmt.Sprint(ins))
	}
	// Each jump skips to the start of the next rule's block (rule 1 at
	// instruction 14).
	want := []string{
		"LdXMemW dst: r2 src: r1 off: 0 imm: 0",
		"AndImm32 dst: r2 imm: 65535",
		"LdXMemW dst: r3 src: r1 off: 0 imm: 0",
		"RShImm32 dst: r3 imm: 16",
		"LdXMemW dst: r4 src: r1 off: 4 imm: 0",
		"LdXMemW dst: r5 src: r1 off: 8 imm: 0",
		"JNEImm dst: r2 off: 7 imm: 2",
		"MovReg32 dst: r1 src: r3",
		"AndImm32 dst: r1 imm: 6",
		"JNEReg dst: r1 off: 4 src: r3",
		"JNEImm dst: r4 off: 3 imm: 1",
		"JNEImm dst: r5 off: 2 imm: 3",
		"MovImm dst: r0 imm: 1",
		"Exit",
		// The catch-all rule: no checks, and no deny block after it.
		"MovImm dst: r0 imm: 1",
		"Exit",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("program:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestDeviceProgramDecisions(t *testing.T) {
	var queries []devRequest
	for _, typ := range []byte{'c', 'b'} {
		for _, mm := range [][2]uint32{{1, 3}, {1, 1}, {1, 9}, {5, 0}, {5, 2}, {7, 0}, {7, 3}, {8, 0}, {8, 3}, {136, 0}, {136, 4095}, {4095, 1048575}} {
			for _, acc := range []string{"r", "w", "rw", "m", "rwm"} {
				queries = append(queries, devRequest{typ, mm[0], mm[1], acc})
			}
		}
	}
	for name, rules := range ruleSets {
		insns, err := deviceProgram(rules)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		allowed := 0
		for _, q := range queries {
			want := allowedByRules(rules, q)
			if got := runDeviceProgram(t, insns, q); got != map[bool]uint64{false: 0, true: 1}[want] {
				t.Errorf("%s: %c %d:%d %s -> %d, want allowed=%v", name, q.Type, q.Major, q.Minor, q.Access, got, want)
			}
			if want {
				allowed++
			}
		}
		t.Logf("%s: %d instructions, %d of %d requests allowed", name, len(insns), allowed, len(queries))
	}
	// Spot checks of the reference itself.
	for _, c := range []struct {
		q    devRequest
		want bool
	}{
		{devRequest{'c', 1, 3, "rw"}, true},
		{devRequest{'c', 1, 3, "m"}, false},
		{devRequest{'c', 1, 1, "r"}, false},
		{devRequest{'b', 1, 3, "r"}, false},
		{devRequest{'c', 136, 7, "rw"}, true},
	} {
		if got := allowedByRules(SandboxDevices, c.q); got != c.want {
			t.Errorf("reference %v = %v", c.q, got)
		}
	}
	for _, bad := range [][]Device{{{'x', 1, 3, "rw"}}, {{'c', 1 << 31, 3, "rw"}}, {{'c', 1, 3, ""}}} {
		if _, err := deviceProgram(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("deviceProgram(%v) = %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestDeviceProgramVerifier loads every generated program into the kernel,
// by this package's loader and by cilium/ebpf's (an independent encoder):
// both must pass the verifier and carry a tag insnsTags computes.
func TestDeviceProgramVerifier(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for name, rules := range ruleSets {
		insns, err := deviceProgram(rules)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := loadDeviceProgram(devicesProgName, devicesProgLicense, insns)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !sameProgram(fd, insnsTags(insns)) {
			info, _ := programInfo(fd)
			t.Errorf("%s: kernel tag %x does not match the instructions", name, info.Tag)
		}
		other, _ := deviceProgram(append([]Device{{'c', 42, 42, "r"}}, rules...))
		if sameProgram(fd, insnsTags(other)) {
			t.Errorf("%s: tag matches a different allowlist", name)
		}
		unix.Close(fd)

		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: devicesProgName, Type: ebpf.CGroupDevice, AttachType: ebpf.AttachCGroupDevice,
			Instructions: asmOf(t, insns), License: devicesProgLicense,
		})
		if err != nil {
			t.Fatalf("%s: cilium/ebpf load: %v", name, err)
		}
		info, err := prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		if tags := insnsTags(insns); info.Tag != fmt.Sprintf("%x", tags[0][:]) && info.Tag != fmt.Sprintf("%x", tags[1][:]) {
			t.Errorf("%s: cilium/ebpf's program has tag %s, want %x or %x", name, info.Tag, tags[0], tags[1])
		}
		prog.Close()
	}
	if have, err := haveDevicePrograms(); !have || err != nil {
		t.Errorf("haveDevicePrograms() = %v, %v on a kernel that just loaded them", have, err)
	}
}

func TestDeviceRulesAllType(t *testing.T) {
	w := deviceWrites(V1, []Device{{'a', 7, -1, "r"}})
	got := fmt.Sprint(w)
	if len(w) != 3 || w[1].Value != "c 7:* r" || w[2].Value != "b 7:* r" {
		t.Errorf("v1 writes for an 'a' rule = %s", got)
	}
	if err := (Resources{Devices: []Device{{'a', -1, -1, "rwm"}}}).Validate(); err != nil {
		t.Errorf("Validate('a') = %v", err)
	}
}
