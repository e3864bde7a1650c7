package cgroup

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Cgroup v2 has no devices controller: the allowlist is a
// BPF_PROG_TYPE_CGROUP_DEVICE program attached to the sandbox's cgroup, which
// the kernel runs on every open() and mknod() of a device node by a process
// in the cgroup (after the v1 devices controller, if any, and before the
// driver). Return 1 allows, 0 denies with EPERM.
//
// Lifetime: the program is attached with BPF_PROG_ATTACH (not a bpf_link), so
// the cgroup holds the only reference that matters: it stays attached after
// the shim or the cubelet that attached it exits or restarts, and the kernel
// detaches and frees it when the cgroup is removed. Nothing needs pinning.

// bpf_cgroup_dev_ctx (include/uapi/linux/bpf.h): three u32 fields.
const (
	devCtxAccessType = 0 // low 16 bits: device type, high 16 bits: access
	devCtxMajor      = 4
	devCtxMinor      = 8
)

// BPF_DEVCG_DEV_* and BPF_DEVCG_ACC_*.
const (
	devcgDevBlock = 1
	devcgDevChar  = 2

	devcgAccMknod = 1
	devcgAccRead  = 2
	devcgAccWrite = 4
	devcgAccAll   = devcgAccMknod | devcgAccRead | devcgAccWrite
)

// devicesProgName is the kernel name of the program (at most 15 characters),
// visible in bpftool prog.
const devicesProgName = "cube_devices"

// devicesProgLicense is informational: the program calls no helpers, so no
// GPL-only function is involved.
const devicesProgLicense = "Proprietary"

// deviceAccessMask converts "rwm" letters into BPF_DEVCG_ACC_* bits.
func deviceAccessMask(access string) int32 {
	var m int32
	if strings.ContainsRune(access, 'r') {
		m |= devcgAccRead
	}
	if strings.ContainsRune(access, 'w') {
		m |= devcgAccWrite
	}
	if strings.ContainsRune(access, 'm') {
		m |= devcgAccMknod
	}
	return m
}

// The eBPF instructions deviceProgram emits (include/uapi/linux/bpf.h:
// class | operation | source).
const (
	opLdXMemW    = 0x01 | 0x60 | 0x00 // BPF_LDX | BPF_MEM | BPF_W
	opAnd32Imm   = 0x04 | 0x50 | 0x00 // BPF_ALU | BPF_AND | BPF_K
	opRSh32Imm   = 0x04 | 0x70 | 0x00 // BPF_ALU | BPF_RSH | BPF_K
	opMov32Reg   = 0x04 | 0xb0 | 0x08 // BPF_ALU | BPF_MOV | BPF_X
	opMov64Imm   = 0x07 | 0xb0 | 0x00 // BPF_ALU64 | BPF_MOV | BPF_K
	opJNEImm     = 0x05 | 0x50 | 0x00 // BPF_JMP | BPF_JNE | BPF_K
	opJNEReg     = 0x05 | 0x50 | 0x08 // BPF_JMP | BPF_JNE | BPF_X
	opExit       = 0x05 | 0x90        // BPF_JMP | BPF_EXIT
	regR0, regR1 = 0, 1
	regR2, regR3 = 2, 3
	regR4, regR5 = 4, 5
)

func insnMovImm(dst uint8, imm int32) bpfInsn { return bpfInsn{Op: opMov64Imm, Dst: dst, Imm: imm} }
func insnExit() bpfInsn                       { return bpfInsn{Op: opExit} }

// deviceProgram generates the instructions of a BPF_CGROUP_DEVICE program
// that allows exactly devs (type 'c', 'b' or 'a' for both; major and minor
// -1 for any; the requested access must be a subset of the rule's) and denies
// everything else. An empty devs denies every device.
//
// Registers: R1 ctx (then scratch), R2 type, R3 requested access, R4 major,
// R5 minor. Each rule is a block of "jump to the next block unless ..."
// checks ending in "return 1"; the last block returns 0.
func deviceProgram(devs []Device) ([]bpfInsn, error) {
	insns := []bpfInsn{
		{Op: opLdXMemW, Dst: regR2, Src: regR1, Off: devCtxAccessType},
		{Op: opAnd32Imm, Dst: regR2, Imm: 0xffff},
		{Op: opLdXMemW, Dst: regR3, Src: regR1, Off: devCtxAccessType},
		{Op: opRSh32Imm, Dst: regR3, Imm: 16},
		{Op: opLdXMemW, Dst: regR4, Src: regR1, Off: devCtxMajor},
		{Op: opLdXMemW, Dst: regR5, Src: regR1, Off: devCtxMinor},
	}
	for _, d := range devs {
		if err := (Resources{Devices: []Device{d}}).Validate(); err != nil {
			return nil, err
		}
		if d.Major > math.MaxInt32 || d.Minor > math.MaxInt32 {
			return nil, fmt.Errorf("device rule %q: number out of range: %w", d.String(), errdefs.ErrInvalidArgument)
		}
		// Every jump of the block goes to the next block; its offset
		// is filled in once the block's length is known.
		var block []bpfInsn
		switch d.Type {
		case 'c':
			block = append(block, bpfInsn{Op: opJNEImm, Dst: regR2, Imm: devcgDevChar})
		case 'b':
			block = append(block, bpfInsn{Op: opJNEImm, Dst: regR2, Imm: devcgDevBlock})
		}
		if acc := deviceAccessMask(d.Access); acc != devcgAccAll {
			// Requested access must be a subset: (req & allowed) == req.
			block = append(block,
				bpfInsn{Op: opMov32Reg, Dst: regR1, Src: regR3},
				bpfInsn{Op: opAnd32Imm, Dst: regR1, Imm: acc},
				bpfInsn{Op: opJNEReg, Dst: regR1, Src: regR3})
		}
		if d.Major >= 0 {
			block = append(block, bpfInsn{Op: opJNEImm, Dst: regR4, Imm: int32(d.Major)})
		}
		if d.Minor >= 0 {
			block = append(block, bpfInsn{Op: opJNEImm, Dst: regR5, Imm: int32(d.Minor)})
		}
		block = append(block, insnMovImm(regR0, 1), insnExit())
		for i := range block {
			if block[i].Op == opJNEImm || block[i].Op == opJNEReg {
				block[i].Off = int16(len(block) - i - 1)
			}
		}
		insns = append(insns, block...)
		if len(block) == 2 {
			// The rule matches everything: what follows would be
			// unreachable, which the verifier rejects.
			return insns, nil
		}
	}
	return append(insns, insnMovImm(regR0, 0), insnExit()), nil
}

// setDevicesV2 makes the device allowlist program for devs the one and only
// BPF_CGROUP_DEVICE program attached to the cgroup2 directory dir. It is
// idempotent: when exactly that program is already attached (the sandbox is
// re-created or re-adopted) it changes nothing; otherwise it attaches the new
// program first and then detaches the others, so the cgroup is never
// without a filter. A kernel without cgroup BPF yields ErrUnavailable.
func setDevicesV2(dir string, devs []Device) error {
	insns, err := deviceProgram(devs)
	if err != nil {
		return err
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	defer unix.Close(fd)

	attached, err := attachedDevicePrograms(fd)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", dir, unsupported(err))
	}
	keep := -1       // fd of the attached program equal to insns, if any
	var others []int // fds of the other attached programs
	defer func() {
		for _, p := range others {
			unix.Close(p)
		}
		if keep >= 0 {
			unix.Close(keep)
		}
	}()
	tags := insnsTags(insns)
	for _, id := range attached {
		p, err := openProgram(id)
		if errors.Is(err, unix.ENOENT) {
			continue // detached and freed meanwhile
		}
		if err != nil {
			return fmt.Errorf("cgroup %s: open attached program %d: %w", dir, id, err)
		}
		if keep < 0 && sameProgram(p, tags) {
			keep = p
			continue
		}
		others = append(others, p)
	}

	if keep < 0 {
		prog, err := loadDeviceProgram(devicesProgName, devicesProgLicense, insns)
		if err != nil {
			return fmt.Errorf("load device allowlist program for %s: %w", dir, unsupported(err))
		}
		keep = prog
		err = attachDeviceProgram(fd, prog, unix.BPF_F_ALLOW_MULTI)
		if err != nil && len(others) == 1 && errors.Is(err, unix.EPERM) {
			// A single program attached without BPF_F_ALLOW_MULTI (not by
			// Cube): attaching with no flags replaces it atomically.
			if err = attachDeviceProgram(fd, prog, 0); err == nil {
				unix.Close(others[0])
				others = nil
			}
		}
		if err != nil {
			return fmt.Errorf("attach device allowlist program to %s: %w", dir, unsupported(err))
		}
		slog.Debug("cgroup: device allowlist attached", "cgroup", dir, "rules", len(devs), "replaced", len(others))
	}
	for _, p := range others {
		if err := detachDeviceProgram(fd, p); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detach stale device program from %s: %w", dir, err)
		}
	}
	return nil
}

// sameProgram reports whether the program open at fd is a device program
// whose kernel tag is one of tags (see insnsTags).
func sameProgram(fd int, tags [2]bpfTag) bool {
	info, err := programInfo(fd)
	return err == nil && info.Type == unix.BPF_PROG_TYPE_CGROUP_DEVICE && (info.Tag == tags[0] || info.Tag == tags[1])
}

// unsupported turns err into ErrUnavailable (kept in the chain) when the
// kernel cannot run cgroup device programs at all.
func unsupported(err error) error {
	if have, perr := haveDevicePrograms(); perr == nil && !have {
		return fmt.Errorf("%w: kernel without cgroup device BPF programs: %w", errdefs.ErrUnavailable, err)
	}
	return err
}
