package cli

import (
	"runtime/debug"
	"testing"
)

func TestTuneServerGC(t *testing.T) {
	old := debug.SetGCPercent(100)
	defer debug.SetGCPercent(old)
	t.Setenv("GOGC", "")
	tuneServerGC()
	if got := debug.SetGCPercent(100); got != serverGCPercent {
		t.Fatalf("GOGC unset: GC percent %d, want %d", got, serverGCPercent)
	}
	t.Setenv("GOGC", "100")
	tuneServerGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GOGC=100 set by the operator: GC percent %d, want it left at 100", got)
	}
}
