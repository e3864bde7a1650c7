package nsrt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/cube-dev/cube/internal/exepath"
)

// NsexecName is the file name of cube-nsexec (cmd/cube-nsexec, C), looked
// for next to the binary sandbox-init runs from when Spec.UsernsExec is
// empty.
//
// With it, the workload's first process (B, see userns.go) is a small
// static C program started by vfork: it unshares its user namespace
// itself, so pid 1 (a Go process, which cannot unshare one: it has
// threads) needs no full fork of itself with CLONE_NEWUSER, and B costs no
// Go runtime start: ~270 page faults less per create, cold create p50
// -20% on the VM this was measured on, where every page first touched
// traps (docs/benchmarks.md).
// Without the binary, B is a second sandbox-init, as before.
const NsexecName = "cube-nsexec"

// nsexecMagic opens the exec request; cmd/cube-nsexec/nsexec.c checks it
// (its comment has the whole format).
const nsexecMagic = "CUBENSX1"

// nsexecPath is cube-nsexec for spec, or "" for none.
func nsexecPath(spec Spec) string {
	if spec.UsernsExec != "" {
		return spec.UsernsExec
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	if p, ok := exepath.Sibling(exe, NsexecName); ok {
		return p
	}
	return ""
}

// startNativeChild is startUsernsChild with cube-nsexec: a plain (vfork)
// start, then the handshake of nsexec.c: 'u' (it unshared its user
// namespace), pid 1 writes the id maps and opens the namespace, 'm'.
func startNativeChild(u *UserNS, path string) (_ *usernsChild, err error) {
	cmd, w, err := usernsChildCmd(path, NsexecName)
	if err != nil {
		return nil, err
	}
	cmd.Env = []string{}
	if err := startUsernsChildCmd(cmd, w); err != nil {
		return nil, fmt.Errorf("start the workload's process %s: %w", path, err)
	}
	c := &usernsChild{u: u, cmd: cmd, release: w, nsFD: -1, native: true}
	defer func() {
		if err != nil {
			c.abort()
		}
	}()
	if err := expectByte(w, 'u'); err != nil {
		return nil, fmt.Errorf("the workload's process did not make its user namespace (see its error above): %w", err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	m := fmt.Appendf(nil, "0 %d %d\n", u.HostID, u.Size)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile("/proc/"+pid+"/"+f, m, 0); err != nil {
			return nil, fmt.Errorf("write the workload's %s: %w", f, err)
		}
	}
	if c.nsFD, err = userNSOf(cmd.Process.Pid, -1); err != nil {
		return nil, err
	}
	if _, err := w.Write([]byte{'m'}); err != nil {
		return nil, fmt.Errorf("tell the workload its ids are mapped: %w", err)
	}
	return c, nil
}

// expectByte reads one byte from f and checks it is want.
func expectByte(f *os.File, want byte) error {
	var b [1]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("it exited")
		}
		return err
	}
	if b[0] != want {
		return fmt.Errorf("it sent %q, expected %q", b[0], want)
	}
	return nil
}

// encodeNsexecRequest is req in cube-nsexec's format, keeping caps.
func encodeNsexecRequest(req execRequest, caps []uintptr) ([]byte, error) {
	fs, err := req.Seccomp.filters()
	if err != nil {
		return nil, err
	}
	var keep uint64
	for _, c := range caps {
		if c >= 64 {
			return nil, fmt.Errorf("capability %d does not fit the request", c)
		}
		keep |= 1 << c
	}
	b := append([]byte(nsexecMagic), binary.NativeEndian.AppendUint64(nil, keep)...)
	u32 := func(n int) { b = binary.NativeEndian.AppendUint32(b, uint32(n)) }
	str := func(s string) { u32(len(s)); b = append(b, s...) }
	strs := func(ss []string) {
		u32(len(ss))
		for _, s := range ss {
			str(s)
		}
	}
	u32(len(fs))
	for _, f := range fs {
		flags := 0
		if f.Log {
			flags = 1
		}
		u32(flags)
		u32(len(f.Prog))
		for _, ins := range f.Prog {
			b = binary.NativeEndian.AppendUint16(b, ins.Code)
			b = append(b, ins.Jt, ins.Jf)
			b = binary.NativeEndian.AppendUint32(b, ins.K)
		}
	}
	str(req.Path)
	strs(req.Args)
	strs(req.Env)
	return b, nil
}
