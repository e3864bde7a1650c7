package cluster

import (
	"fmt"
	"sort"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Candidate is a node as the scheduler sees it at one instant.
type Candidate struct {
	ID          string
	State       State
	HasTemplate bool // template present on the node
	Fetchable   bool // the server can ship the template to the node
	// LayersHeld of LayersTotal leading layers of the template's stack
	// are on the node (a template it holds); only set for a template the
	// server ships as layers, so only the missing ones travel.
	LayersHeld, LayersTotal int
	CPU                     int // schedulable vCPUs
	MemoryMB                int64
	MaxSBX                  int
	MaxCreates              int
	UsedCPU                 int
	UsedMemMB               int64
	Sandboxes               int
	Inflight                int // creates in progress
	// MemReserveMB is the memory the node keeps free by its Usage
	// report (0: no usage-based check).
	MemReserveMB int64
	Usage        *NodeUsage // nil: the node has not reported usage here
}

// Request is one sandbox to place.
type Request struct {
	Template string
	CPU      int
	MemoryMB int64
}

// Filter returns the candidates that can take req, and for the others the
// reason they were rejected.
func Filter(cands []Candidate, req Request) (ok []Candidate, rejected map[string]string) {
	rejected = map[string]string{}
	for _, c := range cands {
		switch {
		case c.State != StateReady:
			rejected[c.ID] = "node is " + string(c.State)
		case !c.HasTemplate && !c.Fetchable:
			rejected[c.ID] = fmt.Sprintf("template %q not on node", req.Template)
		case c.MaxSBX > 0 && c.Sandboxes+c.Inflight >= c.MaxSBX:
			rejected[c.ID] = fmt.Sprintf("sandbox limit %d reached (cubelet --max-sandboxes)", c.MaxSBX)
		case c.MaxCreates > 0 && c.Inflight >= c.MaxCreates:
			rejected[c.ID] = fmt.Sprintf("%d creates in flight, the most it takes at once (cubelet --max-creates; 0 queues them on the node)", c.Inflight)
		case c.CPU > 0 && c.UsedCPU+req.CPU > c.CPU:
			rejected[c.ID] = fmt.Sprintf("cpu: %d of %d vCPU allotted, %d requested (cubelet --cpu-overcommit or --cpu-capacity)", c.UsedCPU, c.CPU, req.CPU)
		case c.MemoryMB > 0 && c.UsedMemMB+req.MemoryMB > c.MemoryMB:
			rejected[c.ID] = fmt.Sprintf("memory: %d of %d MiB allotted, %d requested (cubelet --memory-overcommit or --memory-capacity-mb)", c.UsedMemMB, c.MemoryMB, req.MemoryMB)
		case memoryCheck(c.Usage, c.MemReserveMB, c.Sandboxes+c.Inflight) != "":
			rejected[c.ID] = memoryCheck(c.Usage, c.MemReserveMB, c.Sandboxes+c.Inflight)
		default:
			ok = append(ok, c)
		}
	}
	return ok, rejected
}

// Score ranks a feasible candidate: higher is better. Free capacity spreads
// load across nodes; a node that already has the template wins over one
// that would have to fetch it; creates in flight and CPU the node reports
// busy count against a node. Short of the template, a node holding more
// of its layer stack wins: it fetches less.
func Score(c Candidate, req Request) float64 {
	free := func(used, total int64) float64 {
		if total <= 0 {
			return 1
		}
		return 1 - float64(used)/float64(total)
	}
	s := 0.0
	s += 40 * free(int64(c.UsedCPU+req.CPU), int64(c.CPU))
	s += 40 * free(c.UsedMemMB+req.MemoryMB, c.MemoryMB)
	s += 20 * free(int64(c.Sandboxes+c.Inflight+1), int64(c.MaxSBX))
	if c.HasTemplate {
		s += 50
	} else if c.LayersTotal > 0 {
		s += 40 * float64(c.LayersHeld) / float64(c.LayersTotal)
	}
	s -= 5 * float64(c.Inflight)
	s -= 20 * c.Usage.cpuBusy()
	return s
}

// Pick chooses the best node for req, or fails with ErrResourceExhausted
// naming why each node was rejected. Ties go to the lowest node id, so the
// choice is deterministic.
func Pick(cands []Candidate, req Request) (string, error) {
	ok, rejected := Filter(cands, req)
	if len(ok) == 0 {
		if len(cands) == 0 {
			return "", fmt.Errorf("no nodes registered: %w", errdefs.ErrResourceExhausted)
		}
		ids := make([]string, 0, len(rejected))
		for id := range rejected {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = id + ": " + rejected[id]
		}
		return "", fmt.Errorf("no node can take the sandbox (%s): %w", strings.Join(parts, "; "), errdefs.ErrResourceExhausted)
	}
	best, bestScore := "", 0.0
	for _, c := range ok {
		sc := Score(c, req)
		if best == "" || sc > bestScore || (sc == bestScore && c.ID < best) {
			best, bestScore = c.ID, sc
		}
	}
	return best, nil
}
