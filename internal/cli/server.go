package cli

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/roles"
)

// serverRoles are the roles `cube server --roles` may name.
var serverRoles = []string{"api", "master", "proxy"}

func newServerCmd(r runners) *cobra.Command {
	var cfg roles.ServerConfig
	var logLevel slog.Level
	cfg.Roles = append([]string(nil), serverRoles...)
	c := &cobra.Command{
		Use:   "server",
		Short: "run the control plane (api, master, proxy) for remote cubelets",
		Long: `Run the control plane for remote cubelets: the E2B API, the node registry and
scheduler (master) and the sandbox traffic proxy, or the subset --roles names.
Several replicas may share one PostgreSQL store (--db postgres://...).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneServerGC()
			cfg.Out = cmd.OutOrStdout()
			cfg.Logger = newLogger(cmd.ErrOrStderr(), logLevel)
			return r.server(cmd.Context(), cfg)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	af := apiFlags{Listen: &cfg.Listen, DataDir: &cfg.DataDir, APIKey: &cfg.APIKey, Domain: &cfg.Domain}
	addAPIFlags(fs, af, "address for the API, node registry and sandbox traffic")
	fs.StringVar(&cfg.DB, "db", "", "store: a SQLite path or a postgres:// URL (default <data-dir>/server.db)")
	bindEnv(fs, "db", "CUBE_DB")
	fs.Var(funcValue{
		typ: "roles",
		get: func() string { return strings.Join(cfg.Roles, ",") },
		set: func(s string) error {
			rs, err := parseRoles(s)
			if err == nil {
				cfg.Roles = rs
			}
			return err
		},
	}, "roles", "comma-separated roles to serve: "+strings.Join(serverRoles, ", "))
	bindEnv(fs, "roles", "CUBE_ROLES")
	fs.BoolVar(&cfg.RequireNodeKey, "require-node-key", false, "refuse cubelets that register without an API key (recommended outside a trusted node network)")
	bindEnv(fs, "require-node-key", "CUBE_REQUIRE_NODE_KEY")
	cfg.RateLimits = addRateLimitFlags(fs)
	fs.DurationVar(&cfg.DownAfter, "node-down-after", 0, "mark a node Down after this long without heartbeats and a failed probe (default 10s)")
	addInsecureRegistryFlag(fs, &cfg.InsecureRegistries)
	addMetricsListenFlag(fs, &cfg.MetricsListen, "CUBE_METRICS_LISTEN", "127.0.0.1:9464")
	addLogLevel(fs, &logLevel, slog.LevelInfo)
	return c
}

func parseRoles(s string) ([]string, error) {
	var out []string
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if !containsString(serverRoles, r) {
			return nil, fmt.Errorf("unknown role %q (%s)", r, strings.Join(serverRoles, ", "))
		}
		out = append(out, r)
	}
	return out, nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func newCubeletCmd(r runners) *cobra.Command {
	cfg := roles.CubeletConfig{Network: cubevs.DefaultConfig()}
	host, _ := os.Hostname()
	var servers string
	var capFlags *capacityFlags
	var logLevel slog.Level
	c := &cobra.Command{
		Use:   "cubelet",
		Short: "run the node agent and register with a cube server",
		Long: `Run the node agent: it registers with a cube server (--server; several URLs
fail over in order), heartbeats, and serves the node API the server calls to
create and manage this node's sandboxes.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneServerGC()
			for _, u := range strings.Split(servers, ",") {
				if u = strings.TrimSpace(u); u != "" {
					cfg.ServerURLs = append(cfg.ServerURLs, strings.TrimRight(u, "/"))
				}
			}
			if len(cfg.ServerURLs) == 0 || cfg.NodeID == "" {
				return usageError{"--server and --node-id are required"}
			}
			hostNS, err := resolveHostNetNS(&cfg.Network)
			if err != nil {
				return err
			}
			if cfg.Capacity, err = capFlags.capacity(); err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Exe = roles.ShimBinary(exe)
			if cfg.EnvdPath == "" {
				cfg.EnvdPath = filepath.Join(filepath.Dir(exe), "envd")
			}
			cfg.Logger = newLogger(cmd.ErrOrStderr(), logLevel).With("role", "cubelet", "node", cfg.NodeID)
			if hostNS != nil {
				cfg.Logger.Info("host netns found", "path", hostNS.Path, "pid", hostNS.PID, "id", hostNS.ID, "passed_over", strings.Join(hostNS.Tried, "; "))
			}
			return r.cubelet(cmd.Context(), cfg)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&servers, "server", "", "URL of the cube server; several comma-separated URLs fail over in order")
	bindEnv(fs, "server", "CUBE_SERVER")
	fs.StringVar(&cfg.APIKey, "api-key", "", "API key presented when registering (required by servers run with --require-node-key)")
	bindEnv(fs, "api-key", "CUBE_API_KEY")
	fs.StringVar(&cfg.NodeID, "node-id", host, "this node's id (default the hostname)")
	bindEnv(fs, "node-id", "CUBE_NODE_ID")
	fs.StringVar(&cfg.Listen, "listen", "0.0.0.0:7070", "address of the node API the server calls")
	bindEnv(fs, "listen", "CUBE_CUBELET_LISTEN")
	fs.StringVar(&cfg.AdvertiseIP, "advertise-ip", "", "IP the server uses to reach this node (default: the listen IP or the first non-loopback address)")
	bindEnv(fs, "advertise-ip", "CUBE_ADVERTISE_IP")
	fs.StringVar(&cfg.DataIP, "data-ip", "", "IP on which this node's host ports (sandbox traffic) are reached, when it differs from --advertise-ip (a cubelet on the Pod network: the node's IP)")
	bindEnv(fs, "data-ip", "CUBE_DATA_IP")
	fs.StringVar(&cfg.DataDir, "data-dir", "/var/lib/cube", "data directory")
	bindEnv(fs, "data-dir", "CUBE_DATA_DIR")
	fs.StringVar(&cfg.RunDir, "run-dir", "/run/cube", "runtime directory for kernel anchors (netns pins)")
	bindEnv(fs, "run-dir", "CUBE_RUN_DIR")
	fs.StringVar(&cfg.PrepDir, "prep-dir", "", "directory of the cube prep records (fingerprints), reported to the server (default <data-dir>/prep)")
	bindEnv(fs, "prep-dir", "CUBE_PREP_DIR")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", "cube", "cgroup under which sandbox cgroups are made")
	bindEnv(fs, "cgroup-parent", "CUBE_CGROUP_PARENT")
	fs.StringVar(&cfg.EnvdPath, "envd", "", "path of the envd binary (default: next to the cube binary)")
	bindEnv(fs, "envd", "CUBE_ENVD")
	fs.BoolVar(&cfg.BuildBase, "build-base", true, "build the default template base if missing")
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
	addNetworkFlags(fs, &cfg.Network)
	addNodeCIDRFlag(fs, &cfg.Network.NodeCIDR, "sandbox address range of this node")
	capFlags = addCapacityFlags(fs, 500)
	addMetricsListenFlag(fs, &cfg.MetricsListen, "CUBE_CUBELET_METRICS_LISTEN", "0.0.0.0:9465")
	addLogLevel(fs, &logLevel, slog.LevelInfo)
	return c
}

// hostMemoryMB reads MemTotal from /proc/meminfo (0 when unreadable).
func hostMemoryMB() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb int64
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "MemTotal:") {
			fmt.Sscanf(strings.TrimPrefix(line, "MemTotal:"), "%d", &kb)
		}
	}
	return kb / 1024
}
