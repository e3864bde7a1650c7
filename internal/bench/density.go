package bench

import (
	"context"
	"time"
)

// DensityResult says how many idle sandboxes one node held.
type DensityResult struct {
	Cap     int  `json:"cap"`
	Created int  `json:"created"`
	HitCap  bool `json:"hitCap"`
	// FirstError is the failure that stopped the run ("" when the cap was hit).
	FirstError string       `json:"firstError,omitempty"`
	CreateSec  float64      `json:"createSec"`
	Memory     MemoryResult `json:"memory"`
	// Kill is the latency of each kill while tearing all of them down.
	Kill    Summary `json:"kill"`
	KillSec float64 `json:"killSec"`
}

// RunDensity creates idle sandboxes with conc workers until the first
// failure or limit, measures memory, then kills them all.
func RunDensity(ctx context.Context, c *Client, node Node, limit, conc int) DensityResult {
	r := DensityResult{Cap: limit}
	before, err := ReadMemInfo()
	if err != nil {
		r.FirstError = err.Error()
		return r
	}
	t0 := time.Now()
	ids, cerr := createIdle(ctx, c, limit, conc)
	r.CreateSec = round2(time.Since(t0).Seconds())
	r.Created = len(ids)
	r.HitCap = cerr == nil && len(ids) == limit
	if cerr != nil {
		r.FirstError = cerr.Error()
	}
	settle(ctx, 2*time.Second)
	r.Memory = node.measureMemory(ids, before)
	var kill Samples
	t1 := time.Now()
	killAll(context.WithoutCancel(ctx), c, ids, conc, &kill)
	r.KillSec = round2(time.Since(t1).Seconds())
	r.Kill = kill.Summary()
	return r
}
