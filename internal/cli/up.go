package cli

import (
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/roles"
)

func newUpCmd(r runners) *cobra.Command {
	cfg := roles.AllInOneConfig{Network: cubevs.DefaultConfig()}
	var logLevel slog.Level
	var pprofAddr string
	var capFlags *capacityFlags
	c := &cobra.Command{
		Use:   "up",
		Short: "start all-in-one Cube (server + cubelet) on this machine",
		Long: `Start all-in-one Cube on this machine: the API, the control plane and a node
agent in one process, with SQLite and the template base. It runs until
SIGINT or SIGTERM; sandboxes stop with it unless --keep-sandboxes.`,
		Example: "  cube up --listen 127.0.0.1:3000 --data-dir /var/lib/cube",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneServerGC()
			if _, err := resolveHostNetNS(&cfg.Network); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Exe = roles.ShimBinary(exe)
			if cfg.Capacity, err = capFlags.capacity(); err != nil {
				return err
			}
			if cfg.EnvdPath == "" {
				cfg.EnvdPath = filepath.Join(filepath.Dir(exe), "envd")
			}
			cfg.Out = cmd.OutOrStdout()
			cfg.Logger = newLogger(cmd.ErrOrStderr(), logLevel)
			if pprofAddr != "" {
				if err := servePprof(cmd.Context(), pprofAddr, cfg.Logger); err != nil {
					return err
				}
			}
			return r.allInOne(cmd.Context(), cfg)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	af := apiFlags{Listen: &cfg.Listen, DataDir: &cfg.DataDir, APIKey: &cfg.APIKey, Domain: &cfg.Domain}
	addAPIFlags(fs, af, "address for the API and sandbox traffic")
	fs.StringVar(&cfg.RunDir, "run-dir", "/run/cube", "runtime directory for kernel anchors such as netns pins")
	bindEnv(fs, "run-dir", "CUBE_RUN_DIR")
	fs.BoolVar(&cfg.KeepSandboxes, "keep-sandboxes", false, "leave sandboxes running when Cube stops")
	fs.StringVar(&cfg.EnvdPath, "envd", "", "path of the envd binary (default: next to the cube binary)")
	bindEnv(fs, "envd", "CUBE_ENVD")
	addNodeCIDRFlag(fs, &cfg.Network.NodeCIDR, "sandbox address range of this node")
	addPoolSizeFlags(fs, &cfg.PoolSize, &cfg.PoolMemoryMB, &cfg.PoolFloor)
	fs.BoolVar(&cfg.PoolPrestart, "pool-prestart", true, "warm-pool slots are running sandboxes of template base, personalised at create; false keeps netns + veth + IP + disk only")
	bindEnv(fs, "pool-prestart", "CUBE_POOL_PRESTART")
	addPoolTemplatesFlag(fs, &cfg.PoolTemplates)
	addSandboxLogFlags(fs, &cfg.SandboxLogs)
	fs.IntVar(&cfg.CreateParallelism, "create-parallelism", 0, "creates run at once on this node, the rest wait in arrival order; 0 = two per CPU, -1 = no limit")
	bindEnv(fs, "create-parallelism", "CUBE_CREATE_PARALLELISM")
	addUserNSFlag(fs, &cfg.UserNS)
	addSeccompLogFlag(fs, &cfg.SeccompLog)
	addHostMountNSFlag(fs, &cfg.HostMountNS)
	fs.BoolVar(&cfg.PrebuildInterp, "prebuild-code-interpreter", true, "build template code-interpreter-v1 in the background after start (false: on its first create)")
	bindEnv(fs, "prebuild-code-interpreter", "CUBE_PREBUILD_CODE_INTERPRETER")
	addInsecureRegistryFlag(fs, &cfg.InsecureRegistries)
	cfg.RateLimits = addRateLimitFlags(fs)
	// No count limit by default, as before: the node's address range and
	// the memory reserve bound it.
	capFlags = addCapacityFlags(fs, 0)
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "cube", "cgroup under which sandbox cgroups are made (shims go to <parent>-shims)")
	bindEnv(fs, "cgroup-parent", "CUBE_CGROUP_PARENT")
	addNetworkFlags(fs, &cfg.Network)
	addMetricsListenFlag(fs, &cfg.MetricsListen, "CUBE_METRICS_LISTEN", "127.0.0.1:9464")
	addLogLevel(fs, &logLevel, slog.LevelInfo)
	fs.StringVar(&pprofAddr, "pprof", "", "serve Go profiling endpoints (/debug/pprof) on this address, e.g. 127.0.0.1:6060")
	return c
}

func newDownCmd() *cobra.Command {
	var dataDir string
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "down",
		Short: "stop the all-in-one Cube running on a data dir",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			return roles.StopAllInOne(dataDir, timeout)
		},
	}
	c.Flags().StringVar(&dataDir, "data-dir", "/var/lib/cube", "data directory of the Cube to stop")
	bindEnv(c.Flags(), "data-dir", "CUBE_DATA_DIR")
	c.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for it to stop")
	return c
}
