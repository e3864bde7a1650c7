package preflight

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Status is the outcome of one check.
type Status string

const (
	StatusOK   Status = "ok"
	StatusWarn Status = "warn"
	StatusFail Status = "fail"
	StatusSkip Status = "skip"
)

// Result is one check's verdict with a message saying what to do next.
type Result struct {
	Name    string `json:"name"`
	Status  Status `json:"status"`
	Message string `json:"message"`
}

// Report is the verdict of all checks for one host.
type Report struct {
	// Passed is false when a check failed (or, in strict mode, warned).
	Passed bool `json:"passed"`
	Strict bool `json:"strict"`
	// Runtime is the sandbox runtime this host gets: "ns" or "vm".
	Runtime string   `json:"runtime"`
	Results []Result `json:"results"`
}

// Failed returns the results that make the report fail.
func (r Report) Failed() []Result {
	var out []Result
	for _, res := range r.Results {
		if res.Status == StatusFail || (r.Strict && res.Status == StatusWarn) {
			out = append(out, res)
		}
	}
	return out
}

// Check runs every check over facts. It never touches the host.
func Check(cfg Config, f Facts) Report {
	rep := Report{Strict: cfg.Strict, Runtime: chooseRuntime(cfg, f)}
	rep.Results = []Result{
		checkOverlay(f),
		checkNFTables(f),
		checkCgroups(f),
		checkNetNS(f),
		checkHostNetNS(f),
		checkUserNS(f),
		checkPidMax(cfg, f),
		checkRuntime(cfg, f),
		checkNodeCIDR(cfg),
		checkClusterOverlap("network.service-cidr", "Service", cfg.NodeCIDR, cfg.ServiceCIDRs),
		checkClusterOverlap("network.pod-cidr", "Pod", cfg.NodeCIDR, cfg.PodCIDRs),
		checkRoutes(cfg, f),
		checkPortRange(cfg, f),
		checkNodePorts(cfg),
		checkCNI(f),
		checkKubeProxy(f),
		checkServer(cfg, f),
	}
	rep.Passed = len(rep.Failed()) == 0
	return rep
}

func ok(name, format string, a ...any) Result {
	return Result{name, StatusOK, fmt.Sprintf(format, a...)}
}
func warn(name, format string, a ...any) Result {
	return Result{name, StatusWarn, fmt.Sprintf(format, a...)}
}
func fail(name, format string, a ...any) Result {
	return Result{name, StatusFail, fmt.Sprintf(format, a...)}
}
func skip(name, format string, a ...any) Result {
	return Result{name, StatusSkip, fmt.Sprintf(format, a...)}
}

func checkOverlay(f Facts) Result {
	const n = "kernel.overlayfs"
	switch {
	case f.FilesystemsErr != "":
		return fail(n, "cannot read /proc/filesystems: %s", f.FilesystemsErr)
	case slices.Contains(f.Filesystems, "overlay"):
		return ok(n, "overlay is listed in /proc/filesystems")
	default:
		return fail(n, "overlay is not in /proc/filesystems: load the overlay module (modprobe overlay) or use a kernel with CONFIG_OVERLAY_FS")
	}
}

func checkNFTables(f Facts) Result {
	const n = "kernel.nftables"
	if !f.NFTables.OK {
		return fail(n, "nftables is not usable over netlink (%s): Cube needs nf_tables with nat; run with CAP_NET_ADMIN in the host netns", f.NFTables.Err)
	}
	return ok(n, "nftables answers over netlink (%d tables)", len(f.NFTTables))
}

// requiredControllers are the cgroup controllers sandboxes are limited with.
var requiredControllers = []string{"cpu", "memory", "pids"}

func checkCgroups(f Facts) Result {
	const n = "kernel.cgroups"
	if f.CgroupErr != "" {
		return fail(n, "no usable cgroup hierarchy: %s", f.CgroupErr)
	}
	var missing []string
	for _, c := range requiredControllers {
		if !slices.Contains(f.CgroupControllers, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fail(n, "cgroup %s: controllers %s are missing (have %s); enable them on the kernel command line or in the parent cgroup's subtree_control",
			f.CgroupVersion, strings.Join(missing, ","), strings.Join(f.CgroupControllers, ","))
	}
	return ok(n, "cgroup %s with %s", f.CgroupVersion, strings.Join(requiredControllers, ","))
}

func checkNetNS(f Facts) Result {
	const n = "kernel.netns"
	if !f.NetNS.OK {
		return fail(n, "cannot create a network namespace (%s): Cube needs CONFIG_NET_NS and CAP_SYS_ADMIN", f.NetNS.Err)
	}
	return ok(n, "network namespaces can be created")
}

// checkHostNetNS reports whether a cubelet on the Pod network
// (cubeNode.hostNetwork=false, --host-netns=auto) finds the host netns. A
// warning only: with hostNetwork=true the cubelet needs no other netns.
func checkHostNetNS(f Facts) Result {
	const n = "host.netns"
	if f.HostNetNS.Via == "" {
		return warn(n, "a cubelet on the Pod network (cubeNode.hostNetwork=false) would not find the host netns: %s; keep cubeNode.hostNetwork=true on this node", f.HostNetNS.Err)
	}
	return ok(n, "a cubelet on the Pod network finds the host netns via %s", f.HostNetNS.Via)
}

// checkUserNS reports whether sandboxes get a user namespace under the
// default --userns auto; without one they still run, as host root confined
// by capabilities, seccomp and no_new_privs, hence a warning.
func checkUserNS(f Facts) Result {
	const n = "kernel.userns"
	if !f.UserNS.OK {
		return warn(n, "sandboxes cannot run in a user namespace (%s): with --userns auto root inside a sandbox is root on the host; --userns on refuses to create sandboxes", f.UserNS.Err)
	}
	return ok(n, "sandboxes run in a user namespace (idmapped mounts work)")
}

// Pid budget of a node (measured at 2000 idle base sandboxes:
// docs/benchmarks.md): a sandbox's supervisor, reaper and envd threads plus
// a kernel worker per loop disk, and what the host itself keeps.
const (
	tasksPerSandbox = 16
	hostTasks       = 2048
)

// checkPidMax warns when kernel.pid_max, not the sandbox address range,
// would bound how many sandboxes the node holds: creates then fail with
// "fork: resource temporarily unavailable" long before the node is full.
func checkPidMax(cfg Config, f Facts) Result {
	const n = "kernel.pid-max"
	if f.PidMax <= 0 {
		return skip(n, "kernel.pid_max unknown")
	}
	fit := max(0, (f.PidMax-hostTasks)/tasksPerSandbox)
	addrs := 0
	if p := cfg.NodeCIDR; p.IsValid() && p.Addr().Is4() {
		addrs = 1<<(32-p.Bits()) - 2
	}
	if fit < addrs {
		return warn(n, "kernel.pid_max %d leaves room for about %d sandboxes (~%d tasks each) while the sandbox range %s has %d addresses: "+
			"raise it for dense nodes (sysctl -w kernel.pid_max=4194304, and in /etc/sysctl.d to keep it)", f.PidMax, fit, tasksPerSandbox, cfg.NodeCIDR, addrs)
	}
	return ok(n, "kernel.pid_max %d is enough for every address of %s (~%d tasks per sandbox)", f.PidMax, cfg.NodeCIDR, tasksPerSandbox)
}

func chooseRuntime(cfg Config, f Facts) string {
	switch cfg.Runtime {
	case "ns", "vm":
		return cfg.Runtime
	}
	if f.KVM {
		return "vm"
	}
	return "ns"
}

func checkRuntime(cfg Config, f Facts) Result {
	const n = "runtime.kvm"
	switch cfg.Runtime {
	case "", "auto", "ns", "vm":
	default:
		return fail(n, "runtime %q: want auto, ns or vm", cfg.Runtime)
	}
	rt := chooseRuntime(cfg, f)
	if rt == "vm" && !f.KVM {
		return fail(n, "runtime vm needs /dev/kvm, which is absent: enable virtualization (nested on VMs) or use runtime ns")
	}
	if f.KVM {
		return ok(n, "/dev/kvm present: runtime %s", rt)
	}
	return ok(n, "/dev/kvm absent: runtime %s (namespaces)", rt)
}

func checkNodeCIDR(cfg Config) Result {
	const n = "network.node-cidr"
	p := cfg.NodeCIDR
	if !p.IsValid() || !p.Addr().Is4() || p.Bits() > 29 {
		return fail(n, "sandbox CIDR %s must be an IPv4 prefix of /29 or larger (set cubeNode.network.cidr)", p)
	}
	if p != p.Masked() {
		return fail(n, "sandbox CIDR %s has host bits set; use %s", p, p.Masked())
	}
	return ok(n, "sandbox CIDR %s (%d addresses)", p, 1<<(32-p.Bits()))
}

func checkClusterOverlap(name, what string, node netip.Prefix, cluster []netip.Prefix) Result {
	if len(cluster) == 0 {
		return skip(name, "no %s CIDR configured", what)
	}
	var hits []string
	for _, c := range cluster {
		if node.IsValid() && c.Overlaps(node) {
			hits = append(hits, c.String())
		}
	}
	if len(hits) > 0 {
		return fail(name, "sandbox CIDR %s overlaps the %s CIDR %s: sandboxes could not reach those addresses; choose a disjoint cubeNode.network.cidr",
			node, what, strings.Join(hits, ","))
	}
	return ok(name, "sandbox CIDR %s is disjoint from the %s CIDR %s", node, what, joinPrefixes(cluster))
}

func checkRoutes(cfg Config, f Facts) Result {
	const n = "network.routes"
	if f.RoutesErr != "" {
		return fail(n, "cannot list host routes: %s", f.RoutesErr)
	}
	if !cfg.NodeCIDR.IsValid() {
		return skip(n, "no valid sandbox CIDR")
	}
	var hits []string
	for _, r := range f.Routes {
		if r.Dev != "" && r.Dev == cfg.HostVeth {
			continue // Cube's own transit route
		}
		if r.Dst.Bits() > 0 && r.Dst.Overlaps(cfg.NodeCIDR) {
			hits = append(hits, fmt.Sprintf("%s dev %s", r.Dst, r.Dev))
		}
	}
	for _, a := range f.Addrs {
		if a.Overlaps(cfg.NodeCIDR) {
			hits = append(hits, "address "+a.String())
		}
	}
	if len(hits) > 0 {
		return warn(n, "sandbox CIDR %s overlaps what the host routes (%s): the host is not affected (the CIDR lives only in cube-dp) but sandboxes cannot reach those networks; choose a disjoint cubeNode.network.cidr",
			cfg.NodeCIDR, strings.Join(hits, "; "))
	}
	return ok(n, "sandbox CIDR %s overlaps no host route or address (%d routes)", cfg.NodeCIDR, len(f.Routes))
}

func checkPortRange(cfg Config, f Facts) Result {
	const n = "network.port-range"
	if cfg.PortMin == 0 || cfg.PortMax < cfg.PortMin {
		return fail(n, "host port range %d-%d is invalid", cfg.PortMin, cfg.PortMax)
	}
	if f.ListenersErr != "" {
		return fail(n, "cannot list host listeners: %s", f.ListenersErr)
	}
	var hits []string
	for _, l := range f.Listeners {
		if p := l.Addr.Port(); p >= cfg.PortMin && p <= cfg.PortMax {
			hits = append(hits, l.Proto+" "+l.Addr.String())
		}
	}
	if len(hits) > 0 {
		slices.Sort(hits)
		hits = slices.Compact(hits)
		return fail(n, "host ports in Cube's range %d-%d are in use (%s): Cube DNATs the whole range, so these services would become unreachable; move them or change the port range",
			cfg.PortMin, cfg.PortMax, strings.Join(hits, ", "))
	}
	return ok(n, "no listener in host port range %d-%d", cfg.PortMin, cfg.PortMax)
}

func checkNodePorts(cfg Config) Result {
	const n = "network.nodeport-range"
	if cfg.NodePortMin == 0 {
		return skip(n, "no NodePort range configured")
	}
	if cfg.PortMin <= cfg.NodePortMax && cfg.NodePortMin <= cfg.PortMax {
		return warn(n, "host port range %d-%d overlaps the Kubernetes NodePort range %d-%d: a NodePort in the overlap would be captured by Cube's DNAT; make them disjoint",
			cfg.PortMin, cfg.PortMax, cfg.NodePortMin, cfg.NodePortMax)
	}
	return ok(n, "host port range %d-%d is disjoint from the NodePort range %d-%d", cfg.PortMin, cfg.PortMax, cfg.NodePortMin, cfg.NodePortMax)
}

func checkServer(cfg Config, f Facts) Result {
	const n = "server.reachable"
	if cfg.ServerURL == "" {
		return skip(n, "no server URL given")
	}
	switch {
	case !f.Server.Checked:
		return fail(n, "server %s was not probed", cfg.ServerURL)
	case f.Server.Err != "":
		return fail(n, "GET %s/health: %s: check the URL, DNS (dnsPolicy ClusterFirstWithHostNet on hostNetwork Pods) and firewalls", cfg.ServerURL, f.Server.Err)
	case f.Server.Status < 200 || f.Server.Status > 299:
		return fail(n, "GET %s/health answered %d: the server is not healthy", cfg.ServerURL, f.Server.Status)
	}
	return ok(n, "GET %s/health answered %d", cfg.ServerURL, f.Server.Status)
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
