package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestFloorBurstTimedFromItsStart runs the floor for real: a burst's runs
// are timed from the burst's start, so the median of k runs cannot be
// faster than half of them take on this machine's CPUs.
func TestFloorBurstTimedFromItsStart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the floor clones new namespaces")
	}
	bin := filepath.Join(t.TempDir(), "benchfloor")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/benchfloor")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build benchfloor: %v\n%s", err, out)
	}
	const k = 30
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := RunFloor(ctx, bin, k, k)
	if r.Serial.Errors+r.Concurrent.Errors > 0 || r.Concurrent.N != k {
		t.Fatalf("floor: %+v", r)
	}
	// Each run is mostly CPU (clone, exec, a Go start): the first half of
	// k runs on NumCPU CPUs take k/2/NumCPU runs' time. Half that, for
	// slack.
	least := r.Serial.P50Ms * k / float64(4*runtime.NumCPU())
	if r.Concurrent.P50Ms < least {
		t.Fatalf("burst of %d: p50 %.1f ms, below %.1f ms (serial p50 %.1f ms on %d CPUs): timed from each run's own start?",
			k, r.Concurrent.P50Ms, least, r.Serial.P50Ms, runtime.NumCPU())
	}
	t.Logf("serial p50 %.1f ms; burst of %d p50 %.1f, max %.1f ms", r.Serial.P50Ms, k, r.Concurrent.P50Ms, r.Concurrent.MaxMs)
}
