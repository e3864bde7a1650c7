package cgroup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
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

// deviceProgram generates the instructions of a BPF_CGROUP_DEVICE program
// that allows exactly devs (type 'c', 'b' or 'a' for both; major and minor
// -1 for any; the requested access must be a subset of the rule's) and denies
// everything else. An empty devs denies every device.
//
// Registers: R1 ctx (then scratch), R2 type, R3 requested access, R4 major,
// R5 minor. Each rule is a block of "jump to the next block unless ..."
// checks ending in "return 1"; the last block returns 0.
func deviceProgram(devs []Device) (asm.Instructions, error) {
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, devCtxAccessType, asm.Word),
		asm.And.Imm32(asm.R2, 0xffff),
		asm.LoadMem(asm.R3, asm.R1, devCtxAccessType, asm.Word),
		asm.RSh.Imm32(asm.R3, 16),
		asm.LoadMem(asm.R4, asm.R1, devCtxMajor, asm.Word),
		asm.LoadMem(asm.R5, asm.R1, devCtxMinor, asm.Word),
	}
	label := func(i int) string { return fmt.Sprintf("rule%d", i) }
	for i, d := range devs {
		if err := (Resources{Devices: []Device{d}}).Validate(); err != nil {
			return nil, err
		}
		if d.Major > math.MaxInt32 || d.Minor > math.MaxInt32 {
			return nil, fmt.Errorf("device rule %q: number out of range: %w", d.String(), errdefs.ErrInvalidArgument)
		}
		next := label(i + 1)
		var block asm.Instructions
		switch d.Type {
		case 'c':
			block = append(block, asm.JNE.Imm(asm.R2, devcgDevChar, next))
		case 'b':
			block = append(block, asm.JNE.Imm(asm.R2, devcgDevBlock, next))
		}
		if acc := deviceAccessMask(d.Access); acc != devcgAccAll {
			// Requested access must be a subset: (req & allowed) == req.
			block = append(block,
				asm.Mov.Reg32(asm.R1, asm.R3),
				asm.And.Imm32(asm.R1, acc),
				asm.JNE.Reg(asm.R1, asm.R3, next))
		}
		if d.Major >= 0 {
			block = append(block, asm.JNE.Imm(asm.R4, int32(d.Major), next))
		}
		if d.Minor >= 0 {
			block = append(block, asm.JNE.Imm(asm.R5, int32(d.Minor), next))
		}
		block = append(block, asm.Mov.Imm(asm.R0, 1), asm.Return())
		block[0] = block[0].WithSymbol(label(i))
		insns = append(insns, block...)
		if len(block) == 2 {
			// The rule matches everything: what follows would be
			// unreachable, which the verifier rejects.
			return resolveJumps(insns)
		}
	}
	return resolveJumps(append(insns,
		asm.Mov.Imm(asm.R0, 0).WithSymbol(label(len(devs))),
		asm.Return(),
	))
}

// resolveJumps fills in the offsets of the jumps to labels, so that the
// instructions hash to the tag the kernel computes (see sameProgram).
func resolveJumps(insns asm.Instructions) (asm.Instructions, error) {
	if err := insns.Marshal(io.Discard, hostByteOrder()); err != nil {
		return nil, fmt.Errorf("assemble device program: %w", err)
	}
	return insns, nil
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
	var keep *ebpf.Program // the attached program equal to insns, if any
	var others []*ebpf.Program
	defer func() {
		for _, p := range others {
			p.Close()
		}
		if keep != nil {
			keep.Close()
		}
	}()
	for _, id := range attached {
		p, err := ebpf.NewProgramFromID(id)
		if errors.Is(err, unix.ENOENT) {
			continue // detached and freed meanwhile
		}
		if err != nil {
			return fmt.Errorf("cgroup %s: open attached program %d: %w", dir, id, err)
		}
		if keep == nil && sameProgram(p, insns) {
			keep = p
			continue
		}
		others = append(others, p)
	}

	if keep == nil {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name:         devicesProgName,
			Type:         ebpf.CGroupDevice,
			AttachType:   ebpf.AttachCGroupDevice,
			Instructions: insns,
			License:      devicesProgLicense,
		})
		if err != nil {
			return fmt.Errorf("load device allowlist program for %s: %w", dir, unsupported(err))
		}
		keep = prog
		err = link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: fd, Program: prog, Attach: ebpf.AttachCGroupDevice, Flags: unix.BPF_F_ALLOW_MULTI,
		})
		if err != nil && len(others) == 1 && errors.Is(err, unix.EPERM) {
			// A single program attached without BPF_F_ALLOW_MULTI (not by
			// Cube): attaching with no flags replaces it atomically.
			err = link.RawAttachProgram(link.RawAttachProgramOptions{
				Target: fd, Program: prog, Attach: ebpf.AttachCGroupDevice,
			})
			if err == nil {
				others = nil
			}
		}
		if err != nil {
			return fmt.Errorf("attach device allowlist program to %s: %w", dir, unsupported(err))
		}
		slog.Debug("cgroup: device allowlist attached", "cgroup", dir, "rules", len(devs), "replaced", len(others))
	}
	for _, p := range others {
		err := link.RawDetachProgram(link.RawDetachProgramOptions{
			Target: fd, Program: p, Attach: ebpf.AttachCGroupDevice,
		})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detach stale device program from %s: %w", dir, err)
		}
	}
	return nil
}

// attachedDevicePrograms returns the ids of the BPF_CGROUP_DEVICE programs
// attached directly to the cgroup open at fd (not those inherited from
// ancestors), in attach order.
func attachedDevicePrograms(fd int) ([]ebpf.ProgramID, error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: ebpf.AttachCGroupDevice})
	if err != nil {
		return nil, err
	}
	ids := make([]ebpf.ProgramID, 0, len(res.Programs))
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids, nil
}

// hostByteOrder is binary.NativeEndian as one of the two values the asm
// package accepts.
func hostByteOrder() binary.ByteOrder {
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 {
		return binary.LittleEndian
	}
	return binary.BigEndian
}

// sameProgram reports whether p is a device program whose instructions are
// insns (by the kernel's tag, a hash of the instructions).
func sameProgram(p *ebpf.Program, insns asm.Instructions) bool {
	info, err := p.Info()
	if err != nil || info.Type != ebpf.CGroupDevice {
		return false
	}
	ok, err := insns.HasTag(info.Tag, hostByteOrder())
	return err == nil && ok
}

// unsupported turns err into ErrUnavailable (kept in the chain) when the
// kernel cannot run cgroup device programs at all.
func unsupported(err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) ||
		errors.Is(features.HaveProgramType(ebpf.CGroupDevice), ebpf.ErrNotSupported) {
		return fmt.Errorf("%w: kernel without cgroup device BPF programs: %w", errdefs.ErrUnavailable, err)
	}
	return err
}
