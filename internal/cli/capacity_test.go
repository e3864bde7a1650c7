package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/cubelet"
)

// The capacity flags resolve the same way for `cube cubelet` and `cube up`:
// by default no nominal vCPU or memory limit and a memory reserve; a ratio
// gives cores x ratio; an absolute value wins over the ratio.
func TestCapacityFlags(t *testing.T) {
	parse := func(args ...string) (*capacityFlags, error) {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f := addCapacityFlags(fs, 500)
		return f, fs.Parse(args)
	}
	f, _ := parse()
	c, err := f.resolve(2, 24576)
	if err != nil || c.CpuCount != 0 || c.MemoryMb != 0 || c.MaxSandboxes != 500 || c.MaxCreates != 0 || c.MemoryReserveMb <= 0 {
		t.Fatalf("defaults: %v, %v", c, err)
	}
	f, _ = parse("--cpu-overcommit", "4", "--memory-overcommit", "1.5")
	if c, _ = f.resolve(2, 1000); c.CpuCount != 8 || c.MemoryMb != 1500 {
		t.Fatalf("ratios: %v", c)
	}
	f, _ = parse("--cpu-overcommit", "4", "--cpu-capacity", "64")
	if c, _ = f.resolve(2, 1000); c.CpuCount != 64 {
		t.Fatalf("--cpu-capacity wins over the ratio: %v", c)
	}
	f, _ = parse("--cpu-overcommit", "0.1")
	if c, _ = f.resolve(2, 1000); c.CpuCount != 1 {
		t.Fatalf("a tiny ratio still allows one vCPU: %v", c)
	}
	for _, bad := range [][]string{{"--cpu-overcommit", "-1"}, {"--max-sandboxes", "-1"}, {"--memory-reserve-mb", "-5"}} {
		f, _ = parse(bad...)
		if _, err := f.resolve(2, 1000); err == nil || !strings.Contains(err.Error(), "negative") && !strings.Contains(err.Error(), "positive") {
			t.Errorf("%v: %v", bad, err)
		}
	}
	f, _ = parse("--memory-overcommit", "2")
	if _, err := f.resolve(2, 0); err == nil {
		t.Error("a memory ratio with unknown host memory must fail")
	}
	if got := defaultMemoryReserveMB(24576); got != 2457 {
		t.Errorf("reserve for 24 GiB: %d", got)
	}
	if got := defaultMemoryReserveMB(1024); got != 256 {
		t.Errorf("reserve floor: %d", got)
	}
}

func TestPoolSizeFlag(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		want      int
		wantFloor int
		wantErr   string
	}{
		{nil, cubelet.PoolAdaptive, cubelet.DefaultPoolFloor, ""},
		{[]string{"--pool-size", "auto"}, cubelet.PoolAdaptive, cubelet.DefaultPoolFloor, ""},
		{[]string{"--pool-size", "0"}, 0, cubelet.DefaultPoolFloor, ""},
		{[]string{"--pool-size=12"}, 12, cubelet.DefaultPoolFloor, ""},
		{[]string{"--pool-floor", "4"}, cubelet.PoolAdaptive, 4, ""},
		{[]string{"--pool-floor", "0"}, cubelet.PoolAdaptive, cubelet.DefaultPoolFloor, "at least 1"},
		{[]string{"--pool-floor", "many"}, cubelet.PoolAdaptive, cubelet.DefaultPoolFloor, "at least 1"},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var size, floor int
		var mem int64
		addPoolSizeFlags(fs, &size, &mem, &floor)
		err := fs.Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || size != tc.want || floor != tc.wantFloor || mem <= 0 {
			t.Errorf("%v: size %d, floor %d, budget %d, %v; want size %d, floor %d", tc.args, size, floor, mem, err, tc.want, tc.wantFloor)
		}
	}
}
