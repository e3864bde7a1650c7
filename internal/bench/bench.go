// Package bench measures a running Cube: create/kill latency through the
// REST API and the official e2b SDK, memory per idle sandbox, density,
// cubelet restart-to-serving time, and the floor (raw namespaces + exec of
// a static responder) in the same run, for `cube bench`.
package bench

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Phases, in the order they run (restart last: it replaces the server process).
var Phases = []string{"floor", "serial", "metrics", "concurrent", "sdk", "memory", "density", "restart"}

// Config is one `cube bench` run.
type Config struct {
	Server, APIKey, Template string
	NSerial, NConcurrent     int
	// NBackToBack is creates in bursts with no pause between them (0: none).
	NBackToBack int
	Concurrency int
	// MetricsURL is the measured Cube's /metrics (its --metrics-listen);
	// the metrics phase runs MetricsN serial creates without and
	// MetricsN with a scraper of it every MetricsEvery. "": no phase.
	MetricsURL   string
	MetricsN     int
	MetricsEvery time.Duration
	// SDK sample counts (the node script is slower to drive).
	SDKSerial, SDKConcurrent int
	MemorySandboxes          int
	DensityCap               int
	DensityConcurrency       int
	// DensityProbeN serial creates are timed at 0 and at DensityCap resident.
	DensityProbeN int
	// DensityRestart restarts cube up (with RestartSignal) while the
	// density run's sandboxes are all resident.
	DensityRestart   bool
	RestartSandboxes int
	RestartLog       string
	// RestartSignal stops cube up in the restart phases: SIGTERM (default)
	// or SIGKILL (a crash).
	RestartSignal syscall.Signal
	FloorBin      string
	FloorN        int
	SDKDir        string
	Node          Node
	// Only limits the phases run (nil: all).
	Only   []string
	Logger *slog.Logger
}

func (c Config) restartSignal() syscall.Signal {
	if c.RestartSignal == 0 {
		return syscall.SIGTERM
	}
	return c.RestartSignal
}

func (c Config) enabled(phase string) bool { return len(c.Only) == 0 || slices.Contains(c.Only, phase) }

// Machine describes where the bench ran.
type Machine struct {
	CPUs      int    `json:"cpus"`
	MemTotalK int64  `json:"memTotalKiB"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	Time      string `json:"time"`
}

// Result is everything one run measured; absent phases are nil.
type Result struct {
	Machine    Machine       `json:"machine"`
	Server     string        `json:"server"`
	Template   string        `json:"template"`
	Floor      *FloorResult  `json:"floor,omitempty"`
	RESTSerial *CreateResult `json:"restSerial,omitempty"`
	// RESTConcurrent is bursts of concurrent creates, each on a node that
	// has settled after the one before (what an agent framework's burst
	// meets); RESTBackToBack the same bursts with no pause between them
	// (sustained throughput: the burst competes with the last one's
	// teardown and the pool's refill).
	RESTConcurrent *CreateResult `json:"restConcurrent,omitempty"`
	RESTBackToBack *CreateResult `json:"restBackToBack,omitempty"`
	// ScrapeCost is the metrics phase: serial creates with /metrics
	// scraped and not.
	ScrapeCost *ScrapeCostResult `json:"scrapeCost,omitempty"`
	SDK        *SDKResult        `json:"sdk,omitempty"`
	Memory     *MemoryResult     `json:"memory,omitempty"`
	Density    *DensityResult    `json:"density,omitempty"`
	Restart    *RestartResult    `json:"restart,omitempty"`
	// Ratios are Cube latencies divided by the floor's (same percentile,
	// serial to serial, concurrent to concurrent), keyed "<figure>.<pNN>".
	Ratios map[string]float64 `json:"ratiosToFloor,omitempty"`
}

// Run runs the enabled phases against cfg.Server and returns the results.
func Run(ctx context.Context, cfg Config) (Result, error) {
	log := cfg.Logger
	for _, p := range cfg.Only {
		if !slices.Contains(Phases, p) {
			return Result{}, fmt.Errorf("unknown phase %q (phases: %s)", p, strings.Join(Phases, ","))
		}
	}
	res := Result{Machine: machine(), Server: cfg.Server, Template: cfg.Template}
	c := NewClient(cfg.Server, cfg.APIKey, cfg.Template, max(cfg.Concurrency, 16)*2)
	defer c.Close()
	if err := c.Health(ctx); err != nil {
		return res, fmt.Errorf("cube at %s is not healthy: %w", cfg.Server, err)
	}
	// A Cube just started fills its warm pool: the floor and the first
	// creates timed meanwhile would measure that work.
	t0 := time.Now()
	waitQuiet(ctx, time.Minute)
	log.Info("machine quiet", "waited", time.Since(t0).Round(time.Millisecond))
	if cfg.enabled("floor") {
		if _, err := os.Stat(cfg.FloorBin); err != nil {
			log.Warn("floor skipped: responder binary missing (build it: CGO_ENABLED=0 go build -o bin/benchfloor ./cmd/benchfloor)", "path", cfg.FloorBin)
		} else {
			log.Info("phase floor", "n", cfg.FloorN, "concurrency", cfg.Concurrency)
			f := RunFloor(ctx, cfg.FloorBin, cfg.FloorN, cfg.Concurrency)
			res.Floor = &f
		}
	}
	if cfg.enabled("serial") && cfg.NSerial > 0 {
		log.Info("phase serial", "n", cfg.NSerial)
		r := RunSerial(ctx, c, cfg.NSerial)
		res.RESTSerial = &r
	}
	if cfg.enabled("metrics") && cfg.MetricsN > 0 {
		if cfg.MetricsURL == "" {
			log.Info("metrics phase skipped: no --metrics-url (the measured Cube's --metrics-listen)")
		} else {
			every := cmp.Or(cfg.MetricsEvery, time.Second)
			log.Info("phase metrics", "n", cfg.MetricsN, "url", cfg.MetricsURL, "every", every)
			r := RunScrapeCost(ctx, c, cfg.MetricsURL, cfg.MetricsN, every)
			res.ScrapeCost = &r
		}
	}
	if cfg.enabled("concurrent") && cfg.NConcurrent > 0 {
		log.Info("phase concurrent", "n", cfg.NConcurrent, "concurrency", cfg.Concurrency)
		settle := func(ctx context.Context) { waitQuiet(ctx, settleMax) }
		r := RunBursts(ctx, c, cfg.NConcurrent, cfg.Concurrency, settle)
		res.RESTConcurrent = &r
		if cfg.NBackToBack > 0 {
			waitQuiet(ctx, settleMax)
			log.Info("phase concurrent, back to back", "n", cfg.NBackToBack, "concurrency", cfg.Concurrency)
			r := RunBursts(ctx, c, cfg.NBackToBack, cfg.Concurrency, nil)
			res.RESTBackToBack = &r
		}
	}
	if cfg.enabled("sdk") && cfg.SDKSerial+cfg.SDKConcurrent > 0 {
		log.Info("phase sdk", "serial", cfg.SDKSerial, "concurrent", cfg.SDKConcurrent)
		r := RunSDK(ctx, SDKConfig{Dir: cfg.SDKDir, Server: cfg.Server, Key: cfg.APIKey, Template: cfg.Template,
			NSerial: cfg.SDKSerial, NConcurrent: cfg.SDKConcurrent, Concurrency: cfg.Concurrency})
		res.SDK = &r
	}
	if cfg.enabled("memory") && cfg.MemorySandboxes > 0 {
		log.Info("phase memory", "sandboxes", cfg.MemorySandboxes)
		r := RunMemory(ctx, c, cfg.Node, cfg.MemorySandboxes)
		res.Memory = &r
	}
	if cfg.enabled("density") && cfg.DensityCap > 0 {
		log.Info("phase density", "cap", cfg.DensityCap)
		dc := DensityConfig{Cap: cfg.DensityCap, Concurrency: cfg.DensityConcurrency, ProbeN: cfg.DensityProbeN}
		if cfg.DensityRestart {
			dc.RestartSignal, dc.RestartLog = cfg.restartSignal(), cfg.RestartLog
		}
		r := RunDensity(ctx, c, cfg.Node, dc)
		res.Density = &r
	}
	if cfg.enabled("restart") && cfg.RestartSandboxes > 0 {
		log.Info("phase restart", "sandboxes", cfg.RestartSandboxes)
		r := RunRestart(ctx, c, cfg.Node, cfg.RestartSandboxes, cfg.RestartLog, cfg.restartSignal())
		res.Restart = &r
	}
	res.Ratios = ratios(res)
	return res, ctx.Err()
}

// ratios divides Cube's create latencies by the floor's.
func ratios(r Result) map[string]float64 {
	if r.Floor == nil {
		return nil
	}
	out := map[string]float64{}
	add := func(name string, s, floor Summary) {
		if s.N == 0 || floor.N == 0 {
			return
		}
		out[name+".p50"] = Ratio(s.P50Ms, floor.P50Ms)
		out[name+".p95"] = Ratio(s.P95Ms, floor.P95Ms)
		out[name+".p99"] = Ratio(s.P99Ms, floor.P99Ms)
	}
	if r.RESTSerial != nil {
		add("restSerial", r.RESTSerial.Create, r.Floor.Serial)
	}
	if r.RESTConcurrent != nil {
		add("restConcurrent", r.RESTConcurrent.Create, r.Floor.Concurrent)
	}
	if r.RESTBackToBack != nil {
		add("restBackToBack", r.RESTBackToBack.Create, r.Floor.Concurrent)
	}
	if r.SDK != nil && r.SDK.Error == "" {
		add("sdkSerial", r.SDK.Serial.Total, r.Floor.Serial)
		add("sdkConcurrent", r.SDK.Concurrent.Total, r.Floor.Concurrent)
	}
	return out
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Time: time.Now().UTC().Format(time.RFC3339)}
	if mi, err := ReadMemInfo(); err == nil {
		m.MemTotalK = mi.Total
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	return m
}
