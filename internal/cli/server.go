package cli

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/app"
	"github.com/cube-dev/cube/internal/cubevs"
)

func runServer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	tuneServerGC()
	fs := newFlagSet("server", stderr)
	cfg := app.ServerConfig{Out: stdout}
	fs.StringVar(&cfg.Listen, "listen", envDefault("CUBE_LISTEN", "127.0.0.1:3000"), "address for the API, node registry and sandbox traffic (env CUBE_LISTEN)")
	fs.StringVar(&cfg.DataDir, "data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory (env CUBE_DATA_DIR)")
	fs.StringVar(&cfg.DB, "db", envDefault("CUBE_DB", ""), "store: a SQLite path or a postgres:// URL (env CUBE_DB; default <data-dir>/server.db)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("CUBE_API_KEY"), "API key to accept (env CUBE_API_KEY); default: generate one on first start")
	fs.StringVar(&cfg.Domain, "domain", envDefault("CUBE_DOMAIN", ""), "domain for <port>-<id>.<domain> sandbox hosts (env CUBE_DOMAIN)")
	roles := fs.String("roles", envDefault("CUBE_ROLES", "api,master,proxy"), "comma-separated roles to serve: api, master, proxy")
	fs.BoolVar(&cfg.RequireNodeKey, "require-node-key", os.Getenv("CUBE_REQUIRE_NODE_KEY") == "true", "refuse cubelets that register without an API key (recommended outside a trusted node network)")
	var err error
	if cfg.RateLimits, err = addRateLimitFlags(fs); err != nil {
		return err
	}
	fs.DurationVar(&cfg.DownAfter, "node-down-after", 0, "mark a node Down after this long without heartbeats and a failed probe (default 10s)")
	logLevel := fs.String("log-level", envDefault("CUBE_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %v", fs.Args())}
	}
	for _, r := range strings.Split(*roles, ",") {
		switch r = strings.TrimSpace(r); r {
		case "api", "master", "proxy":
			cfg.Roles = append(cfg.Roles, r)
		default:
			return usageError{fmt.Sprintf("--roles: unknown role %q (api, master, proxy)", r)}
		}
	}
	cfg.Logger = newLogger(stderr, *logLevel)
	return app.RunServer(ctx, cfg)
}

func runCubelet(ctx context.Context, args []string, _, stderr io.Writer) error {
	tuneServerGC()
	fs := newFlagSet("cubelet", stderr)
	host, _ := os.Hostname()
	cfg := app.CubeletConfig{Network: cubevs.DefaultConfig(), Capacity: &nodev1.Capacity{}}
	servers := fs.String("server", envDefault("CUBE_SERVER", ""), "URL of the cube server; several comma-separated URLs fail over in order (env CUBE_SERVER)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("CUBE_API_KEY"), "API key presented when registering (env CUBE_API_KEY; required by servers run with --require-node-key)")
	fs.StringVar(&cfg.NodeID, "node-id", envDefault("CUBE_NODE_ID", host), "this node's id (env CUBE_NODE_ID; default the hostname)")
	fs.StringVar(&cfg.Listen, "listen", envDefault("CUBE_CUBELET_LISTEN", "0.0.0.0:7070"), "address of the node API the server calls")
	fs.StringVar(&cfg.AdvertiseIP, "advertise-ip", envDefault("CUBE_ADVERTISE_IP", ""), "IP the server uses to reach this node (default: the listen IP or the first non-loopback address)")
	fs.StringVar(&cfg.DataIP, "data-ip", envDefault("CUBE_DATA_IP", ""), "IP on which this node's host ports (sandbox traffic) are reached, when it differs from --advertise-ip (a cubelet on the Pod network: the node's IP; env CUBE_DATA_IP)")
	fs.StringVar(&cfg.DataDir, "data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory")
	fs.StringVar(&cfg.RunDir, "run-dir", envDefault("CUBE_RUN_DIR", "/run/cube"), "runtime directory for kernel anchors (netns pins)")
	fs.StringVar(&cfg.PrepDir, "prep-dir", envDefault("CUBE_PREP_DIR", ""), "directory of the cube prep records (fingerprints), reported to the server (default <data-dir>/prep)")
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", envDefault("CUBE_CGROUP_PARENT", "cube"), "cgroup under which sandbox cgroups are made")
	fs.StringVar(&cfg.EnvdPath, "envd", envDefault("CUBE_ENVD", ""), "path of the envd binary (default: next to the cube binary)")
	fs.BoolVar(&cfg.BuildBase, "build-base", true, "build the default template base if missing")
	fs.IntVar(&cfg.PoolSize, "pool-size", envInt("CUBE_POOL_SIZE", 4), "warm-pool slots kept ready for fast creates; 0 disables (env CUBE_POOL_SIZE)")
	fs.BoolVar(&cfg.PoolPrestart, "pool-prestart", envBool("CUBE_POOL_PRESTART", true), "warm-pool slots are running sandboxes of template base, personalised at create; false keeps netns + veth + IP + disk only (env CUBE_POOL_PRESTART)")
	fs.IntVar(&cfg.CreateParallelism, "create-parallelism", envInt("CUBE_CREATE_PARALLELISM", 0), "creates run at once on this node, the rest wait in arrival order; 0 = two per CPU, -1 = no limit (env CUBE_CREATE_PARALLELISM)")
	addUserNSFlag(fs, &cfg.UserNS)
	addHostMountNSFlag(fs, &cfg.HostMountNS)
	nf := addNetworkFlags(fs, &cfg.Network)
	nodeCIDR := fs.String("node-cidr", envDefault("CUBE_NODE_CIDR", cfg.Network.NodeCIDR.String()), "sandbox address range of this node")
	maxSBX := fs.Int("max-sandboxes", 500, "most sandboxes this node takes")
	maxCreates := fs.Int("max-creates", 50, "most concurrent creates this node takes")
	cpus := fs.Int("cpu-capacity", 8*runtime.NumCPU(), "schedulable vCPUs (sandbox cpuCount is summed against it)")
	memMB := fs.Int64("memory-capacity-mb", 2*hostMemoryMB(), "schedulable memory in MiB")
	logLevel := fs.String("log-level", envDefault("CUBE_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	for _, u := range strings.Split(*servers, ",") {
		if u = strings.TrimSpace(u); u != "" {
			cfg.ServerURLs = append(cfg.ServerURLs, strings.TrimRight(u, "/"))
		}
	}
	if len(cfg.ServerURLs) == 0 || cfg.NodeID == "" {
		return usageError{"--server and --node-id are required"}
	}
	p, err := netip.ParsePrefix(*nodeCIDR)
	if err != nil {
		return usageError{fmt.Sprintf("--node-cidr: %v", err)}
	}
	cfg.Network.NodeCIDR = p
	if err := nf.apply(&cfg.Network); err != nil {
		return err
	}
	cfg.Capacity = &nodev1.Capacity{CpuCount: int32(*cpus), MemoryMb: *memMB, MaxSandboxes: int32(*maxSBX), MaxCreates: int32(*maxCreates)}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Exe = app.ShimBinary(exe)
	if cfg.EnvdPath == "" {
		cfg.EnvdPath = filepath.Join(filepath.Dir(exe), "envd")
	}
	cfg.Logger = newLogger(stderr, *logLevel).With("role", "cubelet", "node", cfg.NodeID)
	if h := nf.hostNS; h != nil {
		cfg.Logger.Info("host netns found", "path", h.Path, "pid", h.PID, "id", h.ID, "passed_over", strings.Join(h.Tried, "; "))
	}
	return app.RunCubelet(ctx, cfg)
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
