package seccomp

import (
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// The node agent compiles each filter choice once and hands the program
// down as text: the round trip is exact, and the memo returns the same
// compiled filters for the same choice (in any order of extra names).
func TestFiltersCompiledOnceAndEncoded(t *testing.T) {
	if _, err := NativeArch(); err != nil {
		t.Skip(err)
	}
	a, err := Filters(Options{ExtraAllowed: []string{"kcmp", "bpf"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Filters(Options{ExtraAllowed: []string{"bpf", "kcmp"}})
	if len(a) != 1 || &a[0].Prog[0] != &b[0].Prog[0] {
		t.Error("the same choice was compiled twice")
	}
	def, _ := Filters(Options{})
	if prog, _ := Program(Options{}); &def[0].Prog[0] != &prog[0] {
		t.Error("the default filter is not the process's default program")
	}
	logged, err := Filters(Options{Log: true})
	if err != nil || len(logged) != 2 || logged[0].Log || !logged[1].Log {
		t.Fatalf("log mode filters: %d, %v", len(logged), err)
	}
	for _, f := range append(a, logged...) {
		got, err := DecodeProgram(EncodeProgram(f.Prog))
		if err != nil || !slices.Equal(got, f.Prog) {
			t.Fatalf("round trip of a %d-instruction program: %v", len(f.Prog), err)
		}
	}
	for _, bad := range []string{"", "!!", "AAAA", EncodeProgram(make([]unix.SockFilter, maxInstructions+1))} {
		if _, err := DecodeProgram(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("DecodeProgram(%.20q): %v, want ErrInvalidArgument", bad, err)
		}
	}
	if err := InstallFilters(nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("InstallFilters(nil): %v", err)
	}
}
