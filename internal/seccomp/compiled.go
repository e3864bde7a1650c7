package seccomp

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Filter is one compiled filter and whether the kernel logs its refusals
// (SECCOMP_FILTER_FLAG_LOG).
type Filter struct {
	Prog []unix.SockFilter
	Log  bool
}

// compiledFilters memoises Filters by choice: the node agent compiles each
// distinct choice once per process and hands the result to every sandbox
// (sandbox-init then installs it without compiling).
var compiledFilters sync.Map // key string -> []Filter

// Filters returns the filters InstallDefault(o) installs, in order,
// compiled once per process for each distinct o.
func Filters(o Options) ([]Filter, error) {
	key := fmt.Sprintf("log=%v allow=%s", o.Log, strings.Join(slices.Sorted(slices.Values(o.ExtraAllowed)), ","))
	if fs, ok := compiledFilters.Load(key); ok {
		return fs.([]Filter), nil
	}
	var fs []Filter
	if !o.Log {
		prog, err := Program(o)
		if err != nil {
			return nil, err
		}
		fs = []Filter{{Prog: prog}}
	} else {
		quiet, logged, err := logPrograms(o)
		if err != nil {
			return nil, err
		}
		fs = []Filter{{Prog: quiet}, {Prog: logged, Log: true}}
	}
	got, _ := compiledFilters.LoadOrStore(key, fs)
	return got.([]Filter), nil
}

// InstallFilters installs fs in order (see Install).
func InstallFilters(fs []Filter) error {
	if len(fs) == 0 {
		return fmt.Errorf("seccomp: no filter: %w", errdefs.ErrInvalidArgument)
	}
	for _, f := range fs {
		if err := Install(f.Prog, f.Log); err != nil {
			return err
		}
	}
	return nil
}

// maxInstructions is the kernel's limit on one classic BPF program
// (BPF_MAXINSNS).
const maxInstructions = 4096

// EncodeProgram is prog as text: base64 of its 8-byte instructions
// (code, jt, jf, k; little-endian), as a sandbox's spec.json carries it.
func EncodeProgram(prog []unix.SockFilter) string {
	b := make([]byte, 0, 8*len(prog))
	for _, ins := range prog {
		b = binary.LittleEndian.AppendUint16(b, ins.Code)
		b = append(b, ins.Jt, ins.Jf)
		b = binary.LittleEndian.AppendUint32(b, ins.K)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// DecodeProgram reverses EncodeProgram; an empty, oversized or malformed
// program is an ErrInvalidArgument.
func DecodeProgram(s string) ([]unix.SockFilter, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("seccomp: decode program: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > maxInstructions {
		return nil, fmt.Errorf("seccomp: program of %d bytes is not 1-%d instructions of 8 bytes: %w", len(b), maxInstructions, errdefs.ErrInvalidArgument)
	}
	prog := make([]unix.SockFilter, len(b)/8)
	for i := range prog {
		r := b[8*i:]
		prog[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(r), Jt: r[2], Jf: r[3], K: binary.LittleEndian.Uint32(r[4:])}
	}
	return prog, nil
}
