package cli

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/bench"
)

func newBenchCmd() *cobra.Command {
	exeDir := "."
	if exe, err := os.Executable(); err == nil {
		exeDir = filepath.Dir(exe)
	}
	var cfg bench.Config
	var jsonPath, only, restartSignal string
	var logLevel slog.Level
	c := &cobra.Command{
		Use:   "bench",
		Short: "measure a running Cube: create latency (REST, SDK), memory, density, restart, floor",
		Long: `Measure a running Cube: create latency through REST and the official SDK,
memory per idle sandbox, density, restart with live sandboxes, and the
floor of a static responder. docs/benchmarks.md says how each is read.`,
		Example: "  cube bench --server http://127.0.0.1:3000 --api-key KEY --json bench.json",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.APIKey == "" {
				return usageError{"--api-key (or E2B_API_KEY) is required"}
			}
			if cfg.Concurrency < 1 || cfg.DensityConcurrency < 1 {
				return usageError{"--concurrency and --density-concurrency must be at least 1"}
			}
			switch restartSignal {
			case "term", "TERM", "SIGTERM":
				cfg.RestartSignal = syscall.SIGTERM
			case "kill", "KILL", "SIGKILL":
				cfg.RestartSignal = syscall.SIGKILL
			default:
				return usageError{"--restart-signal must be term or kill"}
			}
			if only != "" {
				cfg.Only = strings.Split(only, ",")
			}
			if cfg.RestartLog == "" && cfg.Node.DataDir != "" {
				cfg.RestartLog = filepath.Join(filepath.Dir(filepath.Clean(cfg.Node.DataDir)), "cube-restarted.log")
			}
			cfg.Logger = newLogger(cmd.ErrOrStderr(), logLevel)
			res, err := bench.Run(cmd.Context(), cfg)
			if werr := bench.WriteTable(cmd.OutOrStdout(), res); werr != nil && err == nil {
				err = werr
			}
			if jsonPath != "" {
				b, jerr := json.MarshalIndent(res, "", "  ")
				if jerr == nil {
					jerr = os.WriteFile(jsonPath, append(b, '\n'), 0o644)
				}
				if jerr != nil && err == nil {
					err = fmt.Errorf("write %s: %w", jsonPath, jerr)
				}
			}
			return err
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&cfg.Server, "server", "http://127.0.0.1:3000", "Cube API URL")
	bindEnv(fs, "server", "E2B_API_URL")
	fs.StringVar(&cfg.APIKey, "api-key", "", "API key")
	bindEnv(fs, "api-key", "E2B_API_KEY", "CUBE_API_KEY")
	fs.StringVar(&jsonPath, "json", "", "also write the results as JSON to this file")
	fs.StringVar(&cfg.Template, "template", "base", "template to create sandboxes from")
	fs.IntVar(&cfg.NSerial, "n-serial", 200, "REST creates one at a time")
	fs.StringVar(&cfg.MetricsURL, "metrics-url", "", "metrics phase: the measured Cube's /metrics (its --metrics-listen), e.g. http://127.0.0.1:9090/metrics (default: no metrics phase)")
	fs.IntVar(&cfg.MetricsN, "metrics-n", 200, "metrics phase: REST creates one at a time with /metrics not scraped, and as many scraped")
	fs.DurationVar(&cfg.MetricsEvery, "metrics-every", time.Second, "metrics phase: scrape interval")
	fs.IntVar(&cfg.NConcurrent, "n-concurrent", 500, "REST creates in bursts of --concurrency, each once the node has settled after the last")
	fs.IntVar(&cfg.NBackToBack, "n-back-to-back", 500, "REST creates in bursts of --concurrency with no pause between them (sustained throughput; 0: none)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 50, "burst size of the concurrent runs (REST, SDK, floor)")
	fs.IntVar(&cfg.SDKSerial, "sdk-n-serial", 50, "SDK create+first command runs one at a time")
	fs.IntVar(&cfg.SDKConcurrent, "sdk-n-concurrent", 100, "SDK create+first command runs in bursts of --concurrency")
	fs.IntVar(&cfg.MemorySandboxes, "memory-n", 20, "idle sandboxes measured for memory overhead")
	fs.IntVar(&cfg.DensityCap, "density-cap", 500, "density: create idle sandboxes until the first failure or this many")
	fs.IntVar(&cfg.DensityConcurrency, "density-concurrency", 4, "creates in flight during the density run")
	fs.IntVar(&cfg.DensityProbeN, "density-probe-n", 20, "density: serial creates timed before the fill (0 resident) and with the node full")
	fs.BoolVar(&cfg.DensityRestart, "density-restart", false, "density: restart cube up (--restart-signal) with every density sandbox resident, time it (needs --data-dir)")
	fs.IntVar(&cfg.RestartSandboxes, "restart-n", 500, "sandboxes alive across the restart of cube up (needs --data-dir and cube up --keep-sandboxes)")
	fs.StringVar(&restartSignal, "restart-signal", "term", "how restarts stop cube up: term (clean stop, needs cube up --keep-sandboxes) or kill (SIGKILL, a crash)")
	fs.StringVar(&cfg.RestartLog, "restart-log", "", "output of the restarted cube up (default <data-dir>/../cube-restarted.log)")
	fs.StringVar(&cfg.Node.DataDir, "data-dir", "", "data dir of the cube up being measured (node-local: memory accounting, restart)")
	fs.StringVar(&cfg.Node.CgroupParent, "cgroup-parent", "cube", "cgroup parent of the sandboxes")
	fs.StringVar(&cfg.FloorBin, "floor-bin", filepath.Join(exeDir, "benchfloor"), "static floor responder (built from ./cmd/benchfloor)")
	fs.IntVar(&cfg.FloorN, "floor-n", 200, "floor runs, serial and in bursts")
	fs.StringVar(&cfg.SDKDir, "sdk-dir", defaultSDKDir(exeDir), "directory holding sdk.mjs and its package.json (test/bench)")
	fs.StringVar(&only, "only", "", "comma-separated phases to run: "+strings.Join(bench.Phases, ","))
	// --log-level of bench never read CUBE_LOG_LEVEL: the Cube it measures does.
	logLevel = slog.LevelInfo
	fs.Var(logLevelValue{&logLevel}, "log-level", "log level: "+strings.Join(logLevels, ", "))
	return c
}

// defaultSDKDir is test/bench in the working directory's repository, or
// next to the binary's (bin/../test/bench).
func defaultSDKDir(exeDir string) string {
	for _, d := range []string{"test/bench", filepath.Join(exeDir, "..", "test", "bench")} {
		if _, err := os.Stat(filepath.Join(d, "sdk.mjs")); err == nil {
			return d
		}
	}
	return "test/bench"
}
