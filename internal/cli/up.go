package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/api"
	"github.com/cube-dev/cube/internal/app"
	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/hostns"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/ratelimit"
)

func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	tuneServerGC()
	fs := newFlagSet("up", stderr)
	cfg := app.AllInOneConfig{Out: stdout, Network: cubevs.DefaultConfig()}
	fs.StringVar(&cfg.Listen, "listen", envDefault("CUBE_LISTEN", "127.0.0.1:3000"), "address for the API and sandbox traffic (env CUBE_LISTEN)")
	fs.StringVar(&cfg.DataDir, "data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory (env CUBE_DATA_DIR)")
	fs.StringVar(&cfg.RunDir, "run-dir", envDefault("CUBE_RUN_DIR", "/run/cube"), "runtime directory for kernel anchors such as netns pins (env CUBE_RUN_DIR)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("CUBE_API_KEY"), "API key to accept (env CUBE_API_KEY); default: generate one on first start")
	fs.StringVar(&cfg.Domain, "domain", envDefault("CUBE_DOMAIN", ""), "domain for <port>-<id>.<domain> sandbox hosts (env CUBE_DOMAIN)")
	fs.BoolVar(&cfg.KeepSandboxes, "keep-sandboxes", false, "leave sandboxes running when Cube stops")
	fs.StringVar(&cfg.EnvdPath, "envd", envDefault("CUBE_ENVD", ""), "path of the envd binary (default: next to the cube binary)")
	nodeCIDR := fs.String("node-cidr", envDefault("CUBE_NODE_CIDR", cfg.Network.NodeCIDR.String()), "sandbox address range of this node")
	fs.IntVar(&cfg.PoolSize, "pool-size", envInt("CUBE_POOL_SIZE", 4), "warm-pool slots (netns + veth + IP + disk) kept ready for fast creates; 0 disables (env CUBE_POOL_SIZE)")
	fs.BoolVar(&cfg.PoolPrestart, "pool-prestart", envBool("CUBE_POOL_PRESTART", true), "warm-pool slots are running sandboxes of template base, personalised at create; false keeps netns + veth + IP + disk only (env CUBE_POOL_PRESTART)")
	fs.IntVar(&cfg.CreateParallelism, "create-parallelism", envInt("CUBE_CREATE_PARALLELISM", 0), "creates run at once on this node, the rest wait in arrival order; 0 = two per CPU, -1 = no limit (env CUBE_CREATE_PARALLELISM)")
	addUserNSFlag(fs, &cfg.UserNS)
	addHostMountNSFlag(fs, &cfg.HostMountNS)
	var err error
	if cfg.RateLimits, err = addRateLimitFlags(fs); err != nil {
		return err
	}
	fs.StringVar(&cfg.CgroupParent, "cgroup-parent", envDefault("CUBE_CGROUP_PARENT", "cube"), "cgroup under which sandbox cgroups are made (shims go to <parent>-shims)")
	nf := addNetworkFlags(fs, &cfg.Network)
	logLevel := fs.String("log-level", envDefault("CUBE_LOG_LEVEL", "info"), "debug, info, warn or error")
	pprofAddr := fs.String("pprof", "", "serve Go profiling endpoints (/debug/pprof) on this address, e.g. 127.0.0.1:6060")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %v", fs.Args())}
	}
	p, err := netip.ParsePrefix(*nodeCIDR)
	if err != nil {
		return usageError{fmt.Sprintf("--node-cidr: %v", err)}
	}
	cfg.Network.NodeCIDR = p
	if err := nf.apply(&cfg.Network); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Exe = app.ShimBinary(exe)
	if cfg.EnvdPath == "" {
		cfg.EnvdPath = filepath.Join(filepath.Dir(exe), "envd")
	}
	cfg.Logger = newLogger(stderr, *logLevel)
	if *pprofAddr != "" {
		if err := servePprof(ctx, *pprofAddr, cfg.Logger); err != nil {
			return err
		}
	}
	return app.RunAllInOne(ctx, cfg)
}

func runDown(_ context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("down", stderr)
	dataDir := fs.String("data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory of the Cube to stop")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for it to stop")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return app.StopAllInOne(*dataDir, *timeout)
}

var _ = flag.ErrHelp

// networkFlags are the dataplane names and ranges that must differ between
// Cube instances sharing a host (simulated nodes, parallel tests).
type networkFlags struct {
	portRange, transit *string
	hostNS             *hostns.Namespace // where --host-netns=auto found it
}

// addNetworkFlags registers --host-veth, --table-prefix, --dp-name,
// --port-range, --transit and --host-netns, defaulting to cfg.
func addNetworkFlags(fs *flag.FlagSet, cfg *cubevs.Config) *networkFlags {
	fs.StringVar(&cfg.HostVeth, "host-veth", envDefault("CUBE_HOST_VETH", cfg.HostVeth), "host side of the veth pair into the dataplane netns")
	fs.StringVar(&cfg.TablePrefix, "table-prefix", envDefault("CUBE_TABLE_PREFIX", cfg.TablePrefix), "name of the nftables tables (host and dataplane netns)")
	fs.StringVar(&cfg.DPName, "dp-name", envDefault("CUBE_DP_NAME", cfg.DPName), "dataplane netns name, pinned at <run-dir>/netns/<name>")
	fs.StringVar(&cfg.HostNetNSPath, "host-netns", envDefault("CUBE_HOST_NETNS", ""), "host network namespace to attach the dataplane to: a path such as /proc/1/ns/net, or auto for a cubelet in a hostPID Pod on the Pod network (pid 1's netns, else the runtime shim's; must differ from its own) (default: Cube's own)")
	return &networkFlags{
		portRange: fs.String("port-range", envDefault("CUBE_PORT_RANGE", fmt.Sprintf("%d-%d", cfg.PortMin, cfg.PortMax)), "host ports mapped to sandboxes, MIN-MAX"),
		transit:   fs.String("transit", envDefault("CUBE_TRANSIT", cfg.Transit.String()), "host<->dataplane transit subnet (/30 or larger)"),
	}
}

func (f *networkFlags) apply(cfg *cubevs.Config) error {
	lo, hi, ok := strings.Cut(*f.portRange, "-")
	pmin, err1 := strconv.ParseUint(lo, 10, 16)
	pmax, err2 := strconv.ParseUint(hi, 10, 16)
	if !ok || err1 != nil || err2 != nil || pmin == 0 || pmax < pmin {
		return usageError{fmt.Sprintf("--port-range %q: want MIN-MAX within 1-65535", *f.portRange)}
	}
	cfg.PortMin, cfg.PortMax = uint16(pmin), uint16(pmax)
	p, err := netip.ParsePrefix(*f.transit)
	if err != nil {
		return usageError{fmt.Sprintf("--transit: %v", err)}
	}
	cfg.Transit = p
	if cfg.HostNetNSPath == "auto" {
		h, err := hostns.Find("/proc", os.Getpid(), "net")
		if err != nil {
			return fmt.Errorf("--host-netns=auto: %w", err)
		}
		cfg.HostNetNSPath, f.hostNS = h.Path, &h
	}
	return nil
}

// addHostMountNSFlag registers --host-mount-ns (env CUBE_HOST_MOUNT_NS):
// the mount namespace sandboxes' shims start in.
func addHostMountNSFlag(fs *flag.FlagSet, v *string) {
	fs.StringVar(v, "host-mount-ns", envDefault("CUBE_HOST_MOUNT_NS", cubelet.HostMountNSAuto),
		"mount namespace sandboxes and their supervisors live in: auto uses the host's when cube runs in a container (found through its parent processes; needs hostPID), and runs cube-shim from next to --envd there; off keeps them in cube's own; or a path such as /proc/<pid>/ns/mnt of a host process (env CUBE_HOST_MOUNT_NS)")
}

// addUserNSFlag registers --userns (env CUBE_USERNS): whether sandboxes run
// in a user namespace.
func addUserNSFlag(fs *flag.FlagSet, mode *nsrt.UserNSMode) {
	*mode = nsrt.UserNSMode(envDefault("CUBE_USERNS", string(nsrt.UserNSAuto)))
	fs.Func("userns", "run sandboxes in a user namespace (root inside is not root on the host): auto uses one where the kernel allows it, on refuses to create sandboxes without one, off never uses one (default auto; env CUBE_USERNS)", func(s string) error {
		m, err := nsrt.ParseUserNSMode(s)
		*mode = m
		return err
	})
}

// addRateLimitFlags registers the per-API-key rate limits of the API role
// (--api-rate-limit, --create-rate-limit) and returns where they land; an
// invalid value in their environment variables is an error.
func addRateLimitFlags(fs *flag.FlagSet) (*api.RateLimits, error) {
	l := api.DefaultRateLimits
	for _, f := range []struct {
		name, env, what string
		dst             *ratelimit.Limit
	}{
		{"api-rate-limit", "CUBE_API_RATE_LIMIT", "every authenticated request", &l.All},
		{"create-rate-limit", "CUBE_CREATE_RATE_LIMIT", "sandbox creations", &l.Creates},
	} {
		if v := os.Getenv(f.env); v != "" {
			parsed, err := ratelimit.Parse(v)
			if err != nil {
				return nil, usageError{fmt.Sprintf("%s: %v", f.env, err)}
			}
			*f.dst = parsed
		}
		dst := f.dst
		fs.Func(f.name, fmt.Sprintf("per-API-key limit on %s: RATE[:BURST] per second, or off; a request past it gets 429 with Retry-After (default %s; env %s)", f.what, dst, f.env), func(s string) error {
			parsed, err := ratelimit.Parse(s)
			if err != nil {
				return err
			}
			*dst = parsed
			return nil
		})
	}
	return &l, nil
}
