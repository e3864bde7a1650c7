package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// waitQuiet waits until the machine's CPUs were at least 80% idle in each
// of quietWindows consecutive quarter seconds, or max has passed: a fresh
// Cube fills its warm pool after start and after a fill, and a probe timed
// meanwhile measures that work, not the create (the density phase's
// creates at 0 and at N resident are compared with each other).
func waitQuiet(ctx context.Context, max time.Duration) {
	deadline := time.Now().Add(max)
	prevIdle, prevTotal, err := cpuTimes()
	quiet := 0
	for err == nil && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
		idle, total, e := cpuTimes()
		if e != nil || total == prevTotal {
			return
		}
		if float64(idle-prevIdle)/float64(total-prevTotal) < 0.8 {
			quiet = 0
		} else if quiet++; quiet == quietWindows {
			return
		}
		prevIdle, prevTotal = idle, total
	}
}

// quietWindows is how many quiet quarter seconds in a row waitQuiet wants:
// a warm pool fills in steps, with pauses shorter than a second.
const quietWindows = 4

// settleMax bounds the wait for a quiet machine before each burst of the
// concurrent phase: a node that never settles still gets measured.
const settleMax = 30 * time.Second

// cpuTimes returns the idle (idle + iowait) and total jiffies of all CPUs
// from /proc/stat.
func cpuTimes() (idle, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return idle, total, nil
}
