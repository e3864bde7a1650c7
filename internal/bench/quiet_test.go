package bench

import (
	"context"
	"runtime"
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

func TestWaitQuietWaitsForBusyCPUs(t *testing.T) {
	// Every CPU busy, then a pause of 0.6 s (a warm pool between two steps
	// of its fill), then busy again: waitQuiet may not return before the
	// second busy span is over (and must by its max).
	start := time.Now()
	spans := [][2]time.Duration{{0, 500 * time.Millisecond}, {1100 * time.Millisecond, 1800 * time.Millisecond}}
	for range runtime.NumCPU() {
		go func() {
			for _, sp := range spans {
				time.Sleep(time.Until(start.Add(sp[0])))
				for time.Since(start) < sp[1] {
				}
			}
		}()
	}
	waitQuiet(context.Background(), 10*time.Second)
	d := time.Since(start)
	if end := spans[1][1]; d < end {
		t.Fatalf("waitQuiet returned after %v, before the CPUs' busy spans ended (%v)", d, end)
	}
	if d > 11*time.Second {
		t.Fatalf("waitQuiet(10s) took %v", d)
	}
}
