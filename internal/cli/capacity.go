package cli

import (
	"fmt"
	"math"
	"runtime"
	"strconv"

	"github.com/spf13/pflag"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/cubelet"
)

// capacityFlags are what the scheduler may place on a node, the same flags
// with the same defaults for `cube cubelet` and `cube up` (whose node is
// scheduled through the same registry), so that a cluster node takes what
// an all-in-one Cube on the same machine takes.
//
// By default nominal sizes (a sandbox's cpuCount and memoryMB) are not
// summed against anything: they are cgroup caps, not reservations, and an
// idle agent sandbox uses a few MiB and no CPU. What protects the node is
// the memory it keeps free (--memory-reserve-mb), checked against the
// usage it reports with every heartbeat; busy CPU only steers placement to
// idler nodes (CPU is compressible). An operator who wants nominal
// guarantees sets an overcommit ratio (or an absolute capacity).
type capacityFlags struct {
	maxSandboxes, maxCreates, cpus int
	cpuOvercommit, memOvercommit   float64
	memMB, reserveMB               int64
}

// addCapacityFlags registers the capacity flags; maxSandboxes is the
// default of --max-sandboxes.
func addCapacityFlags(fs *pflag.FlagSet, maxSandboxes int) *capacityFlags {
	f := &capacityFlags{}
	fs.IntVar(&f.maxSandboxes, "max-sandboxes", maxSandboxes, "most sandboxes this node takes; 0 = no count limit")
	bindEnv(fs, "max-sandboxes", "CUBE_MAX_SANDBOXES")
	fs.IntVar(&f.maxCreates, "max-creates", 0, "most creates in flight on this node before the server answers 503; 0 = no limit (creates past --create-parallelism wait on the node in arrival order)")
	bindEnv(fs, "max-creates", "CUBE_MAX_CREATES")
	fs.Float64Var(&f.cpuOvercommit, "cpu-overcommit", 0, "sum of sandboxes' vCPUs allowed per host core (e.g. 4); 0 = vCPUs are caps, not summed (busy CPU still steers placement)")
	bindEnv(fs, "cpu-overcommit", "CUBE_CPU_OVERCOMMIT")
	fs.IntVar(&f.cpus, "cpu-capacity", 0, "schedulable vCPUs, summed against sandboxes' cpuCount; overrides --cpu-overcommit; 0 = cores x --cpu-overcommit")
	bindEnv(fs, "cpu-capacity", "CUBE_CPU_CAPACITY")
	fs.Float64Var(&f.memOvercommit, "memory-overcommit", 0, "sum of sandboxes' memoryMB allowed per MiB of host memory (e.g. 2); 0 = not summed (--memory-reserve-mb protects the node)")
	bindEnv(fs, "memory-overcommit", "CUBE_MEMORY_OVERCOMMIT")
	fs.Int64Var(&f.memMB, "memory-capacity-mb", 0, "schedulable memory in MiB, summed against sandboxes' memoryMB; overrides --memory-overcommit; 0 = host memory x --memory-overcommit")
	bindEnv(fs, "memory-capacity-mb", "CUBE_MEMORY_CAPACITY_MB")
	fs.Int64Var(&f.reserveMB, "memory-reserve-mb", defaultMemoryReserveMB(hostMemoryMB()), "memory the node keeps free: no new sandbox while available memory (reported each heartbeat) less what the creates since are expected to use is below it; 0 = no check")
	bindEnv(fs, "memory-reserve-mb", "CUBE_MEMORY_RESERVE_MB")
	return f
}

// defaultMemoryReserveMB is a tenth of the host's memory, between 256 MiB
// and 4 GiB: room for page cache, the node's own processes and a burst of
// creates between two heartbeats.
func defaultMemoryReserveMB(hostMB int64) int64 {
	return min(4096, max(256, hostMB/10))
}

// capacity resolves the flags for this host.
func (f *capacityFlags) capacity() (*nodev1.Capacity, error) {
	return f.resolve(runtime.NumCPU(), hostMemoryMB())
}

func (f *capacityFlags) resolve(cores int, hostMB int64) (*nodev1.Capacity, error) {
	switch {
	case f.maxSandboxes < 0 || f.maxCreates < 0 || f.cpus < 0 || f.memMB < 0 || f.reserveMB < 0:
		return nil, usageError{"--max-sandboxes, --max-creates, --cpu-capacity, --memory-capacity-mb and --memory-reserve-mb must not be negative"}
	case f.cpuOvercommit < 0 || f.memOvercommit < 0 || math.IsNaN(f.cpuOvercommit) || math.IsNaN(f.memOvercommit):
		return nil, usageError{"--cpu-overcommit and --memory-overcommit must be 0 (off) or a positive ratio"}
	}
	c := &nodev1.Capacity{MaxSandboxes: int32(f.maxSandboxes), MaxCreates: int32(f.maxCreates), MemoryReserveMb: f.reserveMB,
		CpuCount: int32(f.cpus), MemoryMb: f.memMB}
	if c.CpuCount == 0 && f.cpuOvercommit > 0 {
		c.CpuCount = int32(max(1, math.Floor(float64(cores)*f.cpuOvercommit)))
	}
	if c.MemoryMb == 0 && f.memOvercommit > 0 {
		if hostMB <= 0 {
			return nil, fmt.Errorf("--memory-overcommit: host memory unknown (/proc/meminfo unreadable): set --memory-capacity-mb")
		}
		c.MemoryMb = int64(float64(hostMB) * f.memOvercommit)
	}
	return c, nil
}

// addPoolSizeFlags registers --pool-size (a number of slots, or auto: the
// adaptive pool), --pool-memory-mb (the adaptive pool's budget) and
// --pool-floor (its size when idle), the same for `cube cubelet` and `cube up`.
func addPoolSizeFlags(fs *pflag.FlagSet, size *int, memMB *int64, floor *int) {
	*size = cubelet.PoolAdaptive
	fs.Var(funcValue{
		typ: "N|auto",
		get: func() string {
			if *size < 0 {
				return "auto"
			}
			return strconv.Itoa(*size)
		},
		set: func(s string) error {
			if s == "auto" {
				*size = cubelet.PoolAdaptive
				return nil
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return fmt.Errorf("want a number of slots (0 disables the pool) or auto")
			}
			*size = n
			return nil
		},
	}, "pool-size", "warm-pool slots of the pool template kept ready for fast creates: auto follows demand (the largest recent burst, --pool-floor when idle) within --pool-memory-mb; a number fixes it; 0 disables the pool")
	bindEnv(fs, "pool-size", "CUBE_POOL_SIZE")
	fs.Int64Var(memMB, "pool-memory-mb", cubelet.DefaultPoolMemoryMB(hostMemoryMB()), "memory budget of the adaptive warm pool (--pool-size auto): each slot counts at the memory its template's slots measured (16 MiB until measured)")
	bindEnv(fs, "pool-memory-mb", "CUBE_POOL_MEMORY_MB")
	*floor = cubelet.DefaultPoolFloor
	fs.Var(funcValue{
		typ: "N",
		get: func() string { return strconv.Itoa(*floor) },
		set: func(s string) error {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return fmt.Errorf("want a number of slots, at least 1 (--pool-size 0 disables the pool)")
			}
			*floor = n
			return nil
		},
	}, "pool-floor", "slots the adaptive pool (--pool-size auto) keeps ready with no demand, within --pool-memory-mb: a burst of up to this many creates after a quiet spell is served warm")
	bindEnv(fs, "pool-floor", "CUBE_POOL_FLOOR")
}
