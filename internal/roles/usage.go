package roles

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/cgroup"
)

// usageSampler measures what the node's sandboxes use, for the heartbeat
// (nodev1.NodeUsage): the counters of the cgroup all sandbox cgroups are
// made under, read once per heartbeat (one directory, whatever the number
// of sandboxes), and the host's available memory.
type usageSampler struct {
	parent string // the sandboxes' cgroup parent ("" = cgroup.DefaultParent)

	mu      sync.Mutex
	lastCPU uint64
	lastAt  time.Time
}

// sample returns the usage now; sandboxes is how many sandboxes and pool
// slots the cgroup holds. Nil when nothing could be read (the server then
// places by nominal capacity only).
func (u *usageSampler) sample(sandboxes int) *nodev1.NodeUsage {
	if u == nil {
		return nil
	}
	avail := memAvailableMB()
	out := &nodev1.NodeUsage{MemoryAvailableMb: avail, Sandboxes: int32(sandboxes), Cpus: int32(runtime.NumCPU())}
	cg, err := cgroup.OpenParent(u.parent)
	if err != nil {
		return out
	}
	st, err := cg.Stats()
	if err != nil {
		// No sandbox made yet: the parent does not exist.
		return out
	}
	out.SandboxResidentMb = max(0, st.MemUsage-st.MemCache) >> 20
	if st.MemLimit > 0 {
		// A parent with a limit (a node sized by its operator) runs out
		// there before the host does.
		if left := (st.MemLimit - st.MemUsage) >> 20; avail <= 0 || left < avail {
			out.MemoryAvailableMb = max(0, left)
		}
	}
	now := time.Now()
	u.mu.Lock()
	if !u.lastAt.IsZero() && st.CPUUsageNs >= u.lastCPU {
		if d := now.Sub(u.lastAt); d > 0 {
			out.CpuUsedMilli = int32(float64(st.CPUUsageNs-u.lastCPU) / float64(d.Nanoseconds()) * 1000)
		}
	}
	u.lastCPU, u.lastAt = st.CPUUsageNs, now
	u.mu.Unlock()
	return out
}

// memAvailableMB reads MemAvailable from /proc/meminfo (0 when unreadable).
func memAvailableMB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb >> 10
		}
	}
	return 0
}
