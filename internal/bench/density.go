package bench

import (
	"context"
	"syscall"
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
	// AtZero and AtFull time serial creates (each killed before the next)
	// before the fill and with the node full: what a create costs with 0
	// and with Created sandboxes resident. Empty without --density-probe-n.
	AtZero *CreateResult `json:"createAtZero,omitempty"`
	AtFull *CreateResult `json:"createAtFull,omitempty"`
	// Restart is a restart of cube up with every sandbox resident (with
	// --density-restart), before they are killed.
	Restart *RestartResult `json:"restart,omitempty"`
}

// DensityConfig is one density run.
type DensityConfig struct {
	Cap, Concurrency int
	// ProbeN serial creates are timed at 0 and at Cap resident (0: none).
	ProbeN int
	// RestartSignal, when set, restarts cube up with it while the node is
	// full (see RunRestart); RestartLog gets its output.
	RestartSignal syscall.Signal
	RestartLog    string
}

// RunDensity creates idle sandboxes with cfg.Concurrency workers until the
// first failure or cfg.Cap, measures memory (and create latency at 0 and
// at that many resident, and a restart, when asked), then kills them all.
func RunDensity(ctx context.Context, c *Client, node Node, cfg DensityConfig) DensityResult {
	r := DensityResult{Cap: cfg.Cap}
	if cfg.ProbeN > 0 {
		waitQuiet(ctx, 30*time.Second)
		z := RunSerial(ctx, c, cfg.ProbeN)
		r.AtZero = &z
	}
	before, err := ReadMemInfo()
	if err != nil {
		r.FirstError = err.Error()
		return r
	}
	t0 := time.Now()
	ids, cerr := createIdle(ctx, c, cfg.Cap, cfg.Concurrency)
	r.CreateSec = round2(time.Since(t0).Seconds())
	r.Created = len(ids)
	r.HitCap = cerr == nil && len(ids) == cfg.Cap
	if cerr != nil {
		r.FirstError = cerr.Error()
	}
	settle(ctx, 2*time.Second)
	r.Memory = node.measureMemory(ids, before)
	if cfg.ProbeN > 0 && ctx.Err() == nil {
		waitQuiet(ctx, 30*time.Second)
		f := RunSerial(ctx, c, cfg.ProbeN)
		r.AtFull = &f
	}
	if cfg.RestartSignal != 0 && ctx.Err() == nil {
		rs := restartOver(ctx, c, node, ids, cfg.RestartLog, cfg.RestartSignal)
		r.Restart = &rs
	}
	var kill Samples
	t1 := time.Now()
	killAll(context.WithoutCancel(ctx), c, ids, cfg.Concurrency, &kill)
	r.KillSec = round2(time.Since(t1).Seconds())
	r.Kill = kill.Summary()
	return r
}
