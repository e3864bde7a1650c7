// Package preflight decides whether a host can run a Cube node. Checks are
// pure functions over Facts (gathered separately by Gather, which reads the
// real host) so every decision is table-tested; a node prep writes a
// fingerprint only when the checks pass.
package preflight

import (
	"net/netip"
)

// Config is what the operator asks of the node: ranges Cube will use and the
// cluster ranges they must not collide with.
type Config struct {
	// NodeCIDR is the sandbox address range of this node.
	NodeCIDR netip.Prefix
	// ServiceCIDRs and PodCIDRs are the Kubernetes cluster ranges (empty when
	// unknown or outside Kubernetes).
	ServiceCIDRs []netip.Prefix
	PodCIDRs     []netip.Prefix
	// PortMin and PortMax bound the host ports Cube maps to sandboxes.
	PortMin, PortMax uint16
	// NodePortMin and NodePortMax are kube-proxy's NodePort range (0 when not
	// in Kubernetes).
	NodePortMin, NodePortMax uint16
	// Runtime is "auto" (vm where /dev/kvm exists, else ns), "ns" or "vm".
	Runtime string
	// HostVeth is Cube's own link in the host netns; routes through it are
	// Cube's transit routes and never count as overlaps.
	HostVeth string
	// ServerURL is the Cube server to reach (empty: not checked).
	ServerURL string
	// Strict turns every warning into a failure.
	Strict bool
}

// DefaultConfig returns the defaults that match cubelet's.
func DefaultConfig() Config {
	return Config{
		NodeCIDR:    netip.MustParsePrefix("172.16.0.0/18"),
		PortMin:     20000,
		PortMax:     29999,
		NodePortMin: 30000,
		NodePortMax: 32767,
		Runtime:     "auto",
		HostVeth:    "cube0",
	}
}

// Probe is the outcome of trying something on the host: OK, or the error text.
type Probe struct {
	OK  bool   `json:"ok"`
	Err string `json:"error,omitempty"`
}

// Route is one IPv4 route of the host's main table (default routes excluded).
type Route struct {
	Dst netip.Prefix `json:"dst"`
	Dev string       `json:"dev"`
}

// Listener is a socket bound for incoming traffic on the host.
type Listener struct {
	Proto string         `json:"proto"` // tcp, tcp6, udp, udp6
	Addr  netip.AddrPort `json:"addr"`
}

// CNIConfig is one file of the CNI configuration directory and the plugin
// types it names.
type CNIConfig struct {
	File  string   `json:"file"`
	Types []string `json:"types"`
}

// Facts is everything the checks look at, gathered from one host.
type Facts struct {
	Kernel      string   `json:"kernel"`
	Filesystems []string `json:"filesystems"`
	// FilesystemsErr is set when /proc/filesystems could not be read.
	FilesystemsErr string `json:"filesystemsError,omitempty"`
	NFTables       Probe  `json:"nftables"`
	// NFTTables are "family name" of every nftables table; NFTChains are
	// "table/chain" (iptables-nft chains show up here too).
	NFTTables []string `json:"nftTables,omitempty"`
	NFTChains []string `json:"nftChains,omitempty"`
	// CgroupVersion is "v1" or "v2"; CgroupControllers the usable resource
	// controllers; CgroupErr is set when no usable hierarchy was found.
	CgroupVersion     string   `json:"cgroupVersion,omitempty"`
	CgroupControllers []string `json:"cgroupControllers,omitempty"`
	CgroupErr         string   `json:"cgroupError,omitempty"`
	NetNS             Probe    `json:"netns"`
	// UserNS is whether sandboxes can run in a user namespace (a user
	// namespace and idmapped mounts; see nsrt.ProbeUserNS).
	UserNS Probe   `json:"userns"`
	KVM    bool    `json:"kvm"`
	Routes []Route `json:"routes,omitempty"`
	// Addrs are the host's own IPv4 prefixes (address/prefix length).
	Addrs        []netip.Prefix `json:"addrs,omitempty"`
	RoutesErr    string         `json:"routesError,omitempty"`
	Listeners    []Listener     `json:"listeners,omitempty"`
	ListenersErr string         `json:"listenersError,omitempty"`
	CNIConfigs   []CNIConfig    `json:"cniConfigs,omitempty"`
	// Links are the host's interface names; Processes the command names
	// (comm) of running processes that matter to the checks.
	Links     []string `json:"links,omitempty"`
	Processes []string `json:"processes,omitempty"`
	// Server is the result of GET <ServerURL>/health (zero when not asked).
	Server ServerProbe `json:"server"`
	// HostNetNS is how a cubelet on the Pod network (hostPID) would reach
	// the host netns with --host-netns=auto, seen from the host netns.
	HostNetNS HostNetNSProbe `json:"hostNetns"`
	// PidMax is kernel.pid_max (0: unknown). Every task of every sandbox
	// (its processes and their threads) takes a pid.
	PidMax int `json:"pidMax,omitempty"`
}

// HostNetNSProbe says which process's netns file opens as the host's:
// Via names it ("pid 1", or an ancestor such as the runtime shim), else Err
// says why none did.
type HostNetNSProbe struct {
	Via string `json:"via,omitempty"`
	Err string `json:"error,omitempty"`
}

// ServerProbe is the result of a server health request.
type ServerProbe struct {
	Checked bool   `json:"checked"`
	Status  int    `json:"status,omitempty"`
	Err     string `json:"error,omitempty"`
}
