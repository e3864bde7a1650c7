package cluster

import (
	"fmt"
	"time"
)

// NodeUsage is what a node's sandboxes actually use, as the node last
// reported it (nodev1.NodeUsage, sampled before each heartbeat). Nominal
// capacity (the sum of sandboxes' cpuCount and memoryMB) says little about
// idle agent sandboxes, which use a few MiB and no CPU: the scheduler keeps
// memory free by this report (memory is not compressible: a full node
// OOM-kills) and prefers nodes whose CPU is idle (CPU is: a busy node makes
// sandboxes slower, not dead).
type NodeUsage struct {
	MemoryAvailableMB int64     `json:"memoryAvailableMB"`
	SandboxResidentMB int64     `json:"sandboxResidentMB"`
	Sandboxes         int       `json:"sandboxes"`    // what the resident figure covers (pool slots too)
	CPUUsedMilli      int       `json:"cpuUsedMilli"` // thousandths of a core, since the previous sample
	CPUs              int       `json:"cpus"`
	At                time.Time `json:"at"`
	// countAtReport is the registry's count of the node's sandboxes and
	// creates in flight when the report arrived: sandboxes created since
	// are not in MemoryAvailableMB yet.
	countAtReport int
}

// minSandboxResidentMB is what a sandbox is expected to use before the node
// has reported any (and the floor of the per-sandbox average): an idle base
// sandbox (init, envd) measured 8-12 MiB resident.
const minSandboxResidentMB = 16

// perSandboxMB is the resident memory a new sandbox is expected to use on
// this node: the average of those it runs, at least minSandboxResidentMB.
func (u *NodeUsage) perSandboxMB() int64 {
	if u.Sandboxes <= 0 {
		return minSandboxResidentMB
	}
	return max(minSandboxResidentMB, u.SandboxResidentMB/int64(u.Sandboxes))
}

// memoryCheck says why a node with reserve MiB to keep free cannot take one
// more sandbox, given its last usage report and the sandboxes it has (or is
// creating) now; "" when it can. Creates since the report are expected to
// use perSandboxMB each.
func memoryCheck(u *NodeUsage, reserveMB int64, countNow int) string {
	if u == nil || reserveMB <= 0 || u.MemoryAvailableMB <= 0 {
		return ""
	}
	per := u.perSandboxMB()
	since := max(0, countNow-u.countAtReport)
	left := u.MemoryAvailableMB - int64(since)*per - per
	if left >= reserveMB {
		return ""
	}
	return fmt.Sprintf("memory: %d MiB available at the last report, %d sandboxes since at ~%d MiB each, %d MiB must stay free (cubelet --memory-reserve-mb)",
		u.MemoryAvailableMB, since, per, reserveMB)
}

// cpuBusy is the fraction of the node's cores its sandboxes used at the
// last report (0 when unknown).
func (u *NodeUsage) cpuBusy() float64 {
	if u == nil || u.CPUs <= 0 {
		return 0
	}
	return min(1, float64(u.CPUUsedMilli)/float64(1000*u.CPUs))
}

// RecordUsage keeps a node's usage report for the scheduler. Each replica
// keeps the reports of the heartbeats it receives (a node heartbeats one
// replica at a time); a replica without one places by nominal capacity.
func (r *Registry) RecordUsage(id string, u NodeUsage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return
	}
	u.At = r.cfg.Clock.Now()
	u.countAtReport = n.count + n.inflight
	n.usage = &u
}
