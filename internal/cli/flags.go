package cli

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/api"
	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/hostns"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/ratelimit"
)

// Flag groups shared by several commands; each binds its environment
// variables, so the same values select the same node in every command.

// addNetworkFlags registers the dataplane names and ranges that must differ
// between Cube instances sharing a host (simulated nodes, parallel tests):
// --host-veth, --table-prefix, --dp-name, --host-netns, --port-range and
// --transit, defaulting to cfg and parsed into it.
func addNetworkFlags(fs *pflag.FlagSet, cfg *cubevs.Config) {
	fs.StringVar(&cfg.HostVeth, "host-veth", cfg.HostVeth, "host side of the veth pair into the dataplane netns")
	bindEnv(fs, "host-veth", "CUBE_HOST_VETH")
	fs.StringVar(&cfg.TablePrefix, "table-prefix", cfg.TablePrefix, "name of the nftables tables (host and dataplane netns)")
	bindEnv(fs, "table-prefix", "CUBE_TABLE_PREFIX")
	fs.StringVar(&cfg.DPName, "dp-name", cfg.DPName, "dataplane netns name, pinned at <run-dir>/netns/<name>")
	bindEnv(fs, "dp-name", "CUBE_DP_NAME")
	fs.StringVar(&cfg.HostNetNSPath, "host-netns", "", "host network namespace to attach the dataplane to: a path such as /proc/1/ns/net, or auto for a cubelet in a hostPID Pod on the Pod network (pid 1's netns, else the runtime shim's; must differ from its own) (default: Cube's own)")
	bindEnv(fs, "host-netns", "CUBE_HOST_NETNS")
	fs.Var(portRangeValue{&cfg.PortMin, &cfg.PortMax}, "port-range", "host ports mapped to sandboxes")
	bindEnv(fs, "port-range", "CUBE_PORT_RANGE")
	fs.Var(prefixValue{&cfg.Transit}, "transit", "host<->dataplane transit subnet (/30 or larger)")
	bindEnv(fs, "transit", "CUBE_TRANSIT")
}

// addNodeCIDRFlag registers --node-cidr (env CUBE_NODE_CIDR) into p.
func addNodeCIDRFlag(fs *pflag.FlagSet, p *netip.Prefix, usage string) {
	fs.Var(prefixValue{p}, "node-cidr", usage)
	bindEnv(fs, "node-cidr", "CUBE_NODE_CIDR")
}

// resolveHostNetNS turns --host-netns=auto into the path of the host's
// network namespace (see hostns.Find); other values are kept.
func resolveHostNetNS(cfg *cubevs.Config) (*hostns.Namespace, error) {
	if cfg.HostNetNSPath != "auto" {
		return nil, nil
	}
	h, err := hostns.Find("/proc", os.Getpid(), "net")
	if err != nil {
		return nil, fmt.Errorf("--host-netns=auto: %w", err)
	}
	cfg.HostNetNSPath = h.Path
	return &h, nil
}

// addHostMountNSFlag registers --host-mount-ns (env CUBE_HOST_MOUNT_NS):
// the mount namespace sandboxes' shims start in.
func addHostMountNSFlag(fs *pflag.FlagSet, v *string) {
	fs.StringVar(v, "host-mount-ns", cubelet.HostMountNSAuto,
		"mount namespace sandboxes and their supervisors live in: auto uses the host's when cube runs in a container (found through its parent processes; needs hostPID), and runs cube-shim from next to --envd there; off keeps them in cube's own; or a path such as /proc/<pid>/ns/mnt of a host process")
	bindEnv(fs, "host-mount-ns", "CUBE_HOST_MOUNT_NS")
}

// addUserNSFlag registers --userns (env CUBE_USERNS): whether sandboxes run
// in a user namespace.
func addUserNSFlag(fs *pflag.FlagSet, mode *nsrt.UserNSMode) {
	*mode = nsrt.UserNSAuto
	fs.Var(funcValue{
		typ: "mode",
		get: func() string { return string(*mode) },
		set: func(s string) error {
			m, err := nsrt.ParseUserNSMode(s)
			if err == nil {
				*mode = m
			}
			return err
		},
	}, "userns", "run sandboxes in a user namespace (root inside is not root on the host): auto uses one where the kernel allows it, on refuses to create sandboxes without one, off never uses one")
	bindEnv(fs, "userns", "CUBE_USERNS")
}

// addSeccompLogFlag registers --seccomp-log (env CUBE_SECCOMP_LOG): the
// kernel logs each syscall a sandbox's filter refuses and the cubelet logs
// it with the sandbox id (docs/security.md, "Reading the seccomp log").
func addSeccompLogFlag(fs *pflag.FlagSet, v *bool) {
	fs.BoolVar(v, "seccomp-log", false, "log each syscall the sandbox filter refuses, with the sandbox id (calls still fail with EPERM; reads the kernel log /dev/kmsg; applies to sandboxes started after)")
	bindEnv(fs, "seccomp-log", "CUBE_SECCOMP_LOG")
}

// addRateLimitFlags registers the per-API-key rate limits of the API role
// (--api-rate-limit, --create-rate-limit), starting from
// api.DefaultRateLimits, and returns where they land.
func addRateLimitFlags(fs *pflag.FlagSet) *api.RateLimits {
	l := new(api.RateLimits)
	*l = api.DefaultRateLimits
	for _, f := range []struct {
		name, env, what string
		dst             *ratelimit.Limit
	}{
		{"api-rate-limit", "CUBE_API_RATE_LIMIT", "every authenticated request", &l.All},
		{"create-rate-limit", "CUBE_CREATE_RATE_LIMIT", "sandbox creations", &l.Creates},
	} {
		dst := f.dst
		fs.Var(funcValue{
			typ: "RATE[:BURST]",
			get: func() string { return dst.String() },
			set: func(s string) error {
				parsed, err := ratelimit.Parse(s)
				if err == nil {
					*dst = parsed
				}
				return err
			},
		}, f.name, fmt.Sprintf("per-API-key limit on %s: RATE[:BURST] per second, or off; a request past it gets 429 with Retry-After", f.what))
		bindEnv(fs, f.name, f.env)
	}
	return l
}

// apiFlags are the flags of the processes that serve the E2B API (cube up
// and cube server).
type apiFlags struct {
	Listen, DataDir, APIKey, Domain *string
}

// addAPIFlags adds --listen (described by listenUsage), --data-dir,
// --api-key and --domain, each with its CUBE_* variable.
func addAPIFlags(fs *pflag.FlagSet, f apiFlags, listenUsage string) {
	fs.StringVar(f.Listen, "listen", "127.0.0.1:3000", listenUsage)
	bindEnv(fs, "listen", "CUBE_LISTEN")
	fs.StringVar(f.DataDir, "data-dir", "/var/lib/cube", "data directory")
	bindEnv(fs, "data-dir", "CUBE_DATA_DIR")
	fs.StringVar(f.APIKey, "api-key", "", "API key to accept (default: generate one on first start)")
	bindEnv(fs, "api-key", "CUBE_API_KEY")
	fs.StringVar(f.Domain, "domain", "", "domain for <port>-<id>.<domain> sandbox hosts")
	bindEnv(fs, "domain", "CUBE_DOMAIN")
}
