package interp

import (
	"testing"
	"time"
)

func TestNextRestartDelay(t *testing.T) {
	for _, tc := range []struct {
		prev, ran, want time.Duration
	}{
		{0, 0, restartMin},                                  // first restart
		{0, time.Hour, restartMin},                          // first restart after a long run
		{restartMin, 10 * time.Millisecond, 2 * restartMin}, // crash loop doubles
		{16 * time.Second, time.Second, restartMax},         // capped
		{restartMax, time.Second, restartMax},               // stays capped
		{restartMax, restartReset, restartMin},              // ran long enough: back to the start
	} {
		if got := nextRestartDelay(tc.prev, tc.ran); got != tc.want {
			t.Errorf("nextRestartDelay(%s, %s) = %s, want %s", tc.prev, tc.ran, got, tc.want)
		}
	}
}
