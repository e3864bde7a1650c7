package nldump

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestRetry(t *testing.T) {
	calls := 0
	got, err := Retry(func() ([]int, error) {
		calls++
		if calls < 3 {
			return []int{1}, netlink.ErrDumpInterrupted // partial
		}
		return []int{1, 2}, nil
	})
	if err != nil || len(got) != 2 || calls != 3 {
		t.Errorf("interrupted twice: %v, %v after %d calls", got, err, calls)
	}

	boom := errors.New("boom")
	calls = 0
	if _, err := Retry(func() (int, error) { calls++; return 0, boom }); !errors.Is(err, boom) || calls != 1 {
		t.Errorf("other error: %v after %d calls, want it at once", err, calls)
	}

	calls = 0
	if _, err := Retry(func() (int, error) { calls++; return 0, netlink.ErrDumpInterrupted }); !errors.Is(err, netlink.ErrDumpInterrupted) || calls != Attempts {
		t.Errorf("always interrupted: %v after %d calls", err, calls)
	}
}
