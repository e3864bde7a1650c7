package cgroup

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The few bpf(2) commands the device allowlist needs, made directly: a
// library for them (cilium/ebpf) would be linked into cube-shim, which the
// agent starts three times per create, and its package set costs every
// start ~0.3 ms of CPU, measured. The attribute structs are the prefixes of
// union bpf_attr (include/uapi/linux/bpf.h) that these commands read.

// bpfInsn is struct bpf_insn: opcode, dst and src registers (4 bits each),
// offset and immediate.
type bpfInsn struct {
	Op  uint8
	Dst uint8
	Src uint8
	Off int16
	Imm int32
}

// marshalInsns encodes insns as the kernel reads them on this host.
func marshalInsns(insns []bpfInsn) []byte {
	bo := binary.NativeEndian
	little := bo.Uint16([]byte{1, 0}) == 1
	b := make([]byte, 0, 8*len(insns))
	for _, in := range insns {
		regs := in.Dst&0xf | in.Src<<4
		if !little {
			regs = in.Dst<<4 | in.Src&0xf
		}
		b = append(b, in.Op, regs)
		b = bo.AppendUint16(b, uint16(in.Off))
		b = bo.AppendUint32(b, uint32(in.Imm))
	}
	return b
}

// bpfTag is a program's tag, a hash of its instructions.
type bpfTag [unix.BPF_TAG_SIZE]byte

// insnsTags are the tags the kernel may compute for a program without map
// references (bpf_prog_calc_tag): the first 8 bytes of the SHA-256 of its
// instructions, or of the SHA-1 on kernels before the switch (v6.18 and
// some stable kernels before it).
func insnsTags(insns []bpfInsn) [2]bpfTag {
	code := marshalInsns(insns)
	s256, s1 := sha256.Sum256(code), sha1.Sum(code)
	var tags [2]bpfTag
	copy(tags[0][:], s256[:])
	copy(tags[1][:], s1[:])
	return tags
}

// bpfPointer is a __u64 pointer field of bpf_attr, typed as a pointer so
// that the garbage collector sees it: what it points to stays alive and is
// moved with its stack (an address kept as an integer would not be).
type bpfPointer = unsafe.Pointer

// Pointers must be 64 bits wide to stand for a __u64 field: this fails to
// compile on 32-bit hosts ("overflows uintptr"), which Cube does not build
// for.
var _ [unsafe.Sizeof(bpfPointer(nil)) - 8]struct{}

func ptr[T any](p *T) bpfPointer { return unsafe.Pointer(p) }

func bpfCall(cmd int, attr unsafe.Pointer, size uintptr) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(attr), size)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

type progLoadAttr struct {
	ProgType           uint32
	InsnCnt            uint32
	Insns              bpfPointer
	License            bpfPointer
	LogLevel           uint32
	LogSize            uint32
	LogBuf             bpfPointer
	KernVersion        uint32
	ProgFlags          uint32
	ProgName           [unix.BPF_OBJ_NAME_LEN]byte
	ProgIfindex        uint32
	ExpectedAttachType uint32
}

// loadDeviceProgram loads insns as a BPF_PROG_TYPE_CGROUP_DEVICE program
// and returns its fd. A rejected program's error carries the end of the
// verifier's log.
func loadDeviceProgram(name, license string, insns []bpfInsn) (int, error) {
	code := marshalInsns(insns)
	lic := append([]byte(license), 0)
	attr := progLoadAttr{
		ProgType:           unix.BPF_PROG_TYPE_CGROUP_DEVICE,
		InsnCnt:            uint32(len(insns)),
		Insns:              ptr(&code[0]),
		License:            ptr(&lic[0]),
		ExpectedAttachType: unix.BPF_CGROUP_DEVICE,
	}
	copy(attr.ProgName[:unix.BPF_OBJ_NAME_LEN-1], name)
	fd, err := bpfCall(unix.BPF_PROG_LOAD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EINVAL)) {
		// Load again with the verifier's log, to say why.
		log := make([]byte, 64<<10)
		attr.LogLevel, attr.LogSize = 1, uint32(len(log))
		attr.LogBuf = ptr(&log[0])
		if fd2, err2 := bpfCall(unix.BPF_PROG_LOAD, unsafe.Pointer(&attr), unsafe.Sizeof(attr)); err2 == nil {
			fd, err = fd2, nil // accepted this time
		} else if text := verifierLog(log); text != "" {
			err = fmt.Errorf("%w: verifier: %s", err, text)
		}
	}
	if err != nil {
		return -1, fmt.Errorf("bpf prog load: %w", err)
	}
	return fd, nil
}

// verifierLog returns the last lines of a NUL-terminated verifier log.
func verifierLog(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, "; ")
}

type progAttachAttr struct {
	TargetFD     uint32
	AttachBPFFD  uint32
	AttachType   uint32
	AttachFlags  uint32
	ReplaceBPFFD uint32
}

// attachDeviceProgram attaches prog to the cgroup open at cgFD
// (BPF_PROG_ATTACH, not a bpf_link: the cgroup keeps it).
func attachDeviceProgram(cgFD, prog int, flags uint32) error {
	attr := progAttachAttr{TargetFD: uint32(cgFD), AttachBPFFD: uint32(prog), AttachType: unix.BPF_CGROUP_DEVICE, AttachFlags: flags}
	if _, err := bpfCall(unix.BPF_PROG_ATTACH, unsafe.Pointer(&attr), unsafe.Sizeof(attr)); err != nil {
		return fmt.Errorf("bpf prog attach: %w", err)
	}
	return nil
}

// detachDeviceProgram detaches prog from the cgroup open at cgFD.
func detachDeviceProgram(cgFD, prog int) error {
	attr := progAttachAttr{TargetFD: uint32(cgFD), AttachBPFFD: uint32(prog), AttachType: unix.BPF_CGROUP_DEVICE}
	if _, err := bpfCall(unix.BPF_PROG_DETACH, unsafe.Pointer(&attr), unsafe.Sizeof(attr)); err != nil {
		return fmt.Errorf("bpf prog detach: %w", err)
	}
	return nil
}

type progQueryAttr struct {
	TargetFD    uint32
	AttachType  uint32
	QueryFlags  uint32
	AttachFlags uint32
	ProgIDs     bpfPointer
	ProgCnt     uint32
	_           uint32
}

// attachedDevicePrograms returns the ids of the BPF_CGROUP_DEVICE programs
// attached directly to the cgroup open at fd (not those inherited from
// ancestors), in attach order.
func attachedDevicePrograms(fd int) ([]uint32, error) {
	ids := make([]uint32, 16)
	for {
		attr := progQueryAttr{TargetFD: uint32(fd), AttachType: unix.BPF_CGROUP_DEVICE,
			ProgIDs: ptr(&ids[0]), ProgCnt: uint32(len(ids))}
		_, err := bpfCall(unix.BPF_PROG_QUERY, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
		if errors.Is(err, unix.ENOSPC) && int(attr.ProgCnt) > len(ids) {
			ids = make([]uint32, attr.ProgCnt) // attached meanwhile: ask again
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("bpf prog query: %w", err)
		}
		return ids[:attr.ProgCnt], nil
	}
}

// openProgram returns an fd for the program with id.
func openProgram(id uint32) (int, error) {
	attr := struct{ ID, NextID, OpenFlags uint32 }{ID: id}
	fd, err := bpfCall(unix.BPF_PROG_GET_FD_BY_ID, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return -1, fmt.Errorf("bpf prog get fd by id %d: %w", id, err)
	}
	return fd, nil
}

// progInfo is the head of struct bpf_prog_info; the kernel fills as much of
// the struct as the caller's info_len asks for.
type progInfo struct {
	Type uint32
	ID   uint32
	Tag  bpfTag
}

func programInfo(fd int) (progInfo, error) {
	var info progInfo
	attr := struct {
		FD, InfoLen uint32
		Info        bpfPointer
	}{FD: uint32(fd), InfoLen: uint32(unsafe.Sizeof(info)), Info: ptr(&info)}
	_, err := bpfCall(unix.BPF_OBJ_GET_INFO_BY_FD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
	if err != nil {
		return progInfo{}, fmt.Errorf("bpf obj get info: %w", err)
	}
	return info, nil
}

// haveDevicePrograms reports whether the kernel can load a cgroup device
// program at all, by loading the smallest one ("return 0"). Only a kernel
// that does not know the bpf syscall or the program type counts as
// lacking them; any other failure (EPERM) is reported as such.
func haveDevicePrograms() (bool, error) {
	fd, err := loadDeviceProgram("probe", devicesProgLicense, []bpfInsn{insnMovImm(0, 0), insnExit()})
	switch {
	case err == nil:
		unix.Close(fd)
		return true, nil
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL), errors.Is(err, unix.E2BIG):
		return false, nil
	}
	return false, err
}
