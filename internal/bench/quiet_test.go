package bench

import (
	"context"
	"testing"
	"time"
)

func TestCPUTimes(t *testing.T) {
	idle, total, err := cpuTimes()
	if err != nil || total == 0 || idle > total {
		t.Fatalf("cpuTimes = %d, %d, %v", idle, total, err)
	}
	start := time.Now()
	waitQuiet(context.Background(), 2*time.Second)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("waitQuiet(2s) took %v", d)
	}
}
