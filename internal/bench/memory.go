package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/supervisor"
)

// MemoryResult is the host memory cost of idle sandboxes (means per sandbox, KiB).
type MemoryResult struct {
	Sandboxes int `json:"sandboxes"`
	// Measured is how many of them had readable shim/cgroup accounting.
	Measured int    `json:"measured"`
	Shim     Rollup `json:"shim"`
	// Envd sums every process in the sandbox cgroup (envd and its helpers).
	Envd           Rollup  `json:"envd"`
	EnvdProcs      float64 `json:"envdProcs"`
	CgroupUsageKiB int64   `json:"cgroupUsageKiB"`
	CgroupCacheKiB int64   `json:"cgroupCacheKiB"`
	// Host deltas of /proc/meminfo between before and after the sandboxes
	// existed, divided by Sandboxes (host-wide: noisy if other work runs).
	HostUsedKiB   int64 `json:"hostUsedDeltaKiB"`
	HostKernelKiB int64 `json:"hostKernelDeltaKiB"`
	// HostKernelReclaimableKiB is the reclaimable slab (dentries, inodes)
	// within HostKernelKiB: counted in the overhead, though the kernel
	// frees it under memory pressure.
	HostKernelReclaimableKiB int64 `json:"hostKernelReclaimableDeltaKiB"`
	// OverheadKiB = Shim.PSS + HostKernelKiB: Cube's own cost per idle
	// sandbox beyond envd (its supervisor plus the kernel objects: netns,
	// veth, mounts, cgroups, task structs and page tables).
	OverheadKiB int64 `json:"overheadKiB"`
	// HostUsedBeyondEnvdKiB = HostUsedKiB - Envd.PSS: the same from the
	// host-wide MemAvailable delta, a cross-check that other work on the
	// host makes noisy.
	HostUsedBeyondEnvdKiB int64  `json:"hostUsedBeyondEnvdKiB"`
	Error                 string `json:"error,omitempty"`
}

// Node locates node-local state for memory accounting.
type Node struct {
	DataDir      string // cube up --data-dir
	CgroupParent string // sandbox cgroup parent, default "cube"
}

// runtimeName is the name of a sandbox's state dir and cgroup: its id, or
// for a sandbox made from a pre-started pool slot the slot's id, found
// through the record copy (record.json) in the state dirs.
func (n Node) runtimeName(id string) string {
	dir := filepath.Join(n.DataDir, "node", "sandboxes")
	if _, err := os.Stat(filepath.Join(dir, id)); err == nil {
		return id
	}
	copies, _ := filepath.Glob(filepath.Join(dir, "*", "record.json"))
	for _, f := range copies {
		var r nodestore.Sandbox
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &r) == nil && r.ID == id {
			return r.Runtime()
		}
	}
	return id
}

func (n Node) stateDir(name string) string {
	return filepath.Join(n.DataDir, "node", "sandboxes", name)
}

// sandboxMem is one sandbox's accounting.
type sandboxMem struct {
	shim, envd   Rollup
	procs        int
	usage, cache int64
}

func (n Node) measure(id string) (sandboxMem, error) {
	var m sandboxMem
	name := n.runtimeName(id)
	info, err := supervisor.ReadInfo(n.stateDir(name))
	if err != nil {
		return m, err
	}
	if m.shim, err = ReadRollup(info.PID); err != nil {
		return m, fmt.Errorf("shim %d: %w", info.PID, err)
	}
	cg, err := cgroup.Open(n.CgroupParent, name)
	if err != nil {
		return m, err
	}
	pids, err := cg.Procs()
	if err != nil {
		return m, err
	}
	for _, p := range pids {
		r, err := ReadRollup(p)
		if err != nil {
			continue // exited meanwhile
		}
		m.envd = m.envd.Add(r)
		m.procs++
	}
	st, err := cg.Stats()
	if err != nil {
		return m, err
	}
	m.usage, m.cache = st.MemUsage/1024, st.MemCache/1024
	return m, nil
}

// measureMemory computes a MemoryResult for ids; before is /proc/meminfo
// from before the sandboxes were created. Without a data dir only the host
// deltas are filled in.
func (n Node) measureMemory(ids []string, before MemInfo) MemoryResult {
	r := MemoryResult{Sandboxes: len(ids)}
	if len(ids) == 0 {
		return r
	}
	after, err := ReadMemInfo()
	if err == nil {
		r.HostUsedKiB = (after.Used() - before.Used()) / int64(len(ids))
		r.HostKernelKiB = (after.Kernel() - before.Kernel()) / int64(len(ids))
		r.HostKernelReclaimableKiB = (after.SReclaimable - before.SReclaimable) / int64(len(ids))
	}
	if n.DataDir == "" {
		r.Error = "no --data-dir: per-process accounting skipped"
		return r
	}
	var sum sandboxMem
	for _, id := range ids {
		m, err := n.measure(id)
		if err != nil {
			if r.Error == "" {
				r.Error = fmt.Sprintf("sandbox %s: %v", id, err)
			}
			continue
		}
		r.Measured++
		sum.shim, sum.envd = sum.shim.Add(m.shim), sum.envd.Add(m.envd)
		sum.procs += m.procs
		sum.usage += m.usage
		sum.cache += m.cache
	}
	if k := int64(r.Measured); k > 0 {
		r.Shim = divRollup(sum.shim, k)
		r.Envd = divRollup(sum.envd, k)
		r.EnvdProcs = round2(float64(sum.procs) / float64(k))
		r.CgroupUsageKiB, r.CgroupCacheKiB = sum.usage/k, sum.cache/k
		r.OverheadKiB = r.Shim.PSS + r.HostKernelKiB
		r.HostUsedBeyondEnvdKiB = r.HostUsedKiB - r.Envd.PSS
	}
	return r
}

func divRollup(r Rollup, k int64) Rollup {
	return Rollup{r.RSS / k, r.PSS / k, r.PSSAnon / k, r.PSSFile / k, r.Anon / k, r.Private / k}
}

// createIdle creates up to n sandboxes with conc workers and stops at the
// first failure. It returns the created ids and the first error.
func createIdle(ctx context.Context, c *Client, n, conc int) ([]string, error) {
	var (
		mu       sync.Mutex
		ids      []string
		firstErr error
		next     int
	)
	var wg sync.WaitGroup
	for range max(conc, 1) {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				if firstErr != nil || next >= n {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				id, err := c.Create(ctx)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					ids = append(ids, id)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ids, firstErr
}

// RunMemory creates n idle sandboxes one at a time, lets them settle,
// measures them and kills them.
func RunMemory(ctx context.Context, c *Client, node Node, n int) MemoryResult {
	before, err := ReadMemInfo()
	if err != nil {
		return MemoryResult{Error: err.Error()}
	}
	ids, cerr := createIdle(ctx, c, n, 1)
	defer killAll(context.WithoutCancel(ctx), c, ids, 8, nil)
	settle(ctx, 2*time.Second)
	r := node.measureMemory(ids, before)
	if cerr != nil && r.Error == "" {
		r.Error = cerr.Error()
	}
	return r
}

func settle(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
