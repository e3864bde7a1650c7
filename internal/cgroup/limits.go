package cgroup

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// cpuPeriodUs is the CFS period; the quota is CPUCount periods per period.
const cpuPeriodUs = 100000

// Resources are the limits of one sandbox. Zero means "no limit".
type Resources struct {
	// CPUCount limits CPU time to CPUCount*100ms per 100ms period.
	CPUCount int
	// MemoryMB limits memory (and, where the host accounts it, memory+swap).
	MemoryMB int
	// PidsMax limits the number of tasks.
	PidsMax int
	// Devices, when not nil, is the only devices the cgroup's processes may
	// open or create (v1 devices controller, v2 BPF_CGROUP_DEVICE program; see
	// deviceWrites and setDevicesV2).
	Devices []Device `json:",omitempty"`
}

// Validate rejects negative limits.
func (r Resources) Validate() error {
	if r.CPUCount < 0 || r.MemoryMB < 0 || r.PidsMax < 0 {
		return fmt.Errorf("negative resource limit %+v: %w", r, errdefs.ErrInvalidArgument)
	}
	for _, d := range r.Devices {
		if (d.Type != 'c' && d.Type != 'b' && d.Type != 'a') || d.Major < -1 || d.Minor < -1 ||
			d.Access == "" || strings.Trim(d.Access, "rwm") != "" {
			return fmt.Errorf("invalid device rule %q: %w", d.String(), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// fileWrite is one write of a limit into a controller file.
type fileWrite struct {
	Controller string // v1 controller, or "unified" for v2
	File       string
	Value      string
	Optional   bool // the file may be missing (e.g. no swap accounting)
}

// limitWrites returns, in order, the writes that apply r under version v.
func limitWrites(v Version, r Resources) []fileWrite {
	if v == V2 {
		const u = "unified"
		w := []fileWrite{}
		if r.MemoryMB > 0 {
			w = append(w,
				fileWrite{u, "memory.max", strconv.FormatInt(int64(r.MemoryMB)<<20, 10), false},
				fileWrite{u, "memory.swap.max", "0", true})
		} else {
			w = append(w, fileWrite{u, "memory.max", "max", false})
		}
		w = append(w, fileWrite{u, "pids.max", maxOr(r.PidsMax), false})
		if r.CPUCount > 0 {
			w = append(w, fileWrite{u, "cpu.max", fmt.Sprintf("%d %d", r.CPUCount*cpuPeriodUs, cpuPeriodUs), false})
		} else {
			w = append(w, fileWrite{u, "cpu.max", fmt.Sprintf("max %d", cpuPeriodUs), false})
		}
		return w
	}
	w := deviceWrites(v, r.Devices)
	if r.MemoryMB > 0 {
		b := strconv.FormatInt(int64(r.MemoryMB)<<20, 10)
		w = append(w,
			fileWrite{"memory", "memory.limit_in_bytes", b, false},
			// memsw must be >= limit_in_bytes, so it is written second.
			fileWrite{"memory", "memory.memsw.limit_in_bytes", b, true})
	}
	w = append(w, fileWrite{"pids", "pids.max", maxOr(r.PidsMax), false})
	w = append(w, fileWrite{"cpu", "cpu.cfs_period_us", strconv.Itoa(cpuPeriodUs), false})
	if r.CPUCount > 0 {
		w = append(w, fileWrite{"cpu", "cpu.cfs_quota_us", strconv.Itoa(r.CPUCount * cpuPeriodUs), false})
	} else {
		w = append(w, fileWrite{"cpu", "cpu.cfs_quota_us", "-1", false})
	}
	return w
}

func maxOr(n int) string {
	if n > 0 {
		return strconv.Itoa(n)
	}
	return "max"
}
