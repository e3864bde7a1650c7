package preflight

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"

	"github.com/cube-dev/cube/internal/cubevs"
)

// NodeCheck is the outcome of one check of the host a configured node runs
// on (CheckNode).
type NodeCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// NodeSetup is what CheckNode needs of a cubelet's configuration.
type NodeSetup struct {
	Network  cubevs.Config
	EnvdPath string
}

// CheckNode checks that the host can run the node s describes: nftables
// usable, overlayfs available, cgroup controllers memory/pids/cpu present,
// IPv4 forwarding on (once the dataplane exists), the netns pin dir usable,
// the envd binary present, no host listener in the mapped port range and no
// host route overlapping the node CIDR or the transit subnet. It changes
// nothing. Unlike Check, it looks at one node's own configuration and its
// dataplane (cube node doctor), not at a host before installation.
func CheckNode(s NodeSetup) []NodeCheck {
	var out []NodeCheck
	add := func(name string, err error, okDetail string) {
		c := NodeCheck{Name: name, OK: err == nil, Detail: okDetail}
		if err != nil {
			c.Detail = err.Error()
		}
		out = append(out, c)
	}
	nw := s.Network
	host, herr := hostNetNS(nw)
	if herr == nil {
		defer host.Close()
	}
	// withHost runs fn on an OS thread switched into the host netns, so the
	// per-netns files under /proc/thread-self/net and /proc/sys/net show the
	// host's view.
	withHost := func(fn func() error) error {
		if herr != nil {
			return herr
		}
		return cubevs.InNetNS(host, fn)
	}
	add("nftables", withHost(nodeNFTables), "nf_tables answers")
	add("overlayfs", nodeOverlay(), "overlay in /proc/filesystems")
	add("cgroup-controllers", nodeCgroups(), "memory, pids and cpu present")
	add("ip-forward", withHost(func() error { return nodeForward(nw) }), "")
	add("netns-pin-dir", nodePinDir(nw), filepath.Join(nw.RunDir, "netns"))
	add("envd", nodeEnvd(s.EnvdPath), s.EnvdPath)
	add("port-range", withHost(func() error { return nodePorts(nw.PortMin, nw.PortMax) }),
		fmt.Sprintf("no host listener in %d-%d", nw.PortMin, nw.PortMax))
	add("routes", withHost(func() error { return nodeRoutes(nw) }),
		fmt.Sprintf("no host route overlaps %s or %s", nw.NodeCIDR, nw.Transit))
	return out
}

func hostNetNS(nw cubevs.Config) (netns.NsHandle, error) {
	if nw.HostNetNSPath != "" {
		return netns.GetFromPath(nw.HostNetNSPath)
	}
	return netns.Get()
}

func nodeNFTables() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	if _, err := c.ListTables(); err != nil {
		return fmt.Errorf("nftables unusable: %w (needs nf_tables in the kernel and CAP_NET_ADMIN)", err)
	}
	return nil
}

func nodeOverlay() error {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return err
	}
	if slices.Contains(ParseFilesystems(string(b)), "overlay") {
		return nil
	}
	return errors.New("overlay is not in /proc/filesystems (load the overlay module)")
}

func nodeCgroups() error {
	var f Facts
	gatherCgroups(&f)
	if f.CgroupErr != "" {
		return errors.New(f.CgroupErr)
	}
	var missing []string
	for _, c := range []string{"memory", "pids", "cpu"} {
		if !slices.Contains(f.CgroupControllers, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cgroup %s controllers missing: %s", f.CgroupVersion, strings.Join(missing, ", "))
	}
	return nil
}

// nodeForward runs in the host netns: forwarding must be on once the
// dataplane exists (cubevs.Open turns it on; something turned it off since).
func nodeForward(nw cubevs.Config) error {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if ok, _ := isMountPoint(nw.DataplanePin()); !ok {
		return nil // cube turns it on when it creates the dataplane
	}
	return errors.New("net.ipv4.ip_forward is 0 on the host although the dataplane exists: traffic from other hosts cannot reach sandboxes; set it to 1")
}

func nodePinDir(nw cubevs.Config) error {
	dir := filepath.Join(nw.RunDir, "netns")
	st, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // made at first start
	}
	if err != nil {
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	pin := nw.DataplanePin()
	if ok, err := isMountPoint(pin); err == nil && !ok {
		if _, serr := os.Stat(pin); serr == nil {
			return fmt.Errorf("%s exists but is not a mounted netns (a crash during creation; cube repairs it at start)", pin)
		}
	}
	return nil
}

// isMountPoint reports whether something is mounted on path in this
// process's mount namespace (a pinned netns is a bind mount of its nsfs).
func isMountPoint(path string) (bool, error) {
	mounts, err := readMountInfo("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(mounts, func(m MountInfo) bool { return m.Point == path }), nil
}

func nodeEnvd(path string) error {
	if path == "" {
		return errors.New("no envd path configured")
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("envd binary: %w (build it with `make build`)", err)
	}
	if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("envd binary %s is not an executable file", path)
	}
	return nil
}

// nodePorts runs in the host netns and looks for TCP listeners and bound
// UDP sockets in [min, max]: the host DNATs that whole range to sandboxes,
// so such a listener is unreachable on the host's addresses.
func nodePorts(min, max uint16) error {
	socks, err := ReadProcNet("/proc/thread-self/net")
	if err != nil {
		return fmt.Errorf("read host sockets: %w", err)
	}
	var busy []string
	for _, s := range socks {
		if p := s.Local.Port(); s.HoldsPort() && p >= min && p <= max {
			busy = append(busy, s.Proto+"/"+strconv.Itoa(int(p)))
		}
	}
	if len(busy) > 0 {
		slices.Sort(busy)
		busy = slices.Compact(busy)
		return fmt.Errorf("host sockets listen in the mapped port range: %s; choose another --port-range or move them", strings.Join(busy, ", "))
	}
	return nil
}

// nodeRoutes runs in the host netns: no route other than Cube's own
// transit route (through the host veth) may overlap the node CIDR or the
// transit subnet.
func nodeRoutes(nw cubevs.Config) error {
	_, routes, err := hostRoutes()
	if err != nil {
		return fmt.Errorf("list host routes: %w", err)
	}
	var bad []string
	for _, r := range routes {
		if r.Dev == nw.HostVeth {
			continue
		}
		for _, p := range []netip.Prefix{nw.NodeCIDR, nw.Transit} {
			if p.IsValid() && r.Dst.Overlaps(p) {
				bad = append(bad, fmt.Sprintf("%s dev %s overlaps %s", r.Dst, r.Dev, p))
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("host routes overlap Cube's ranges: %s; choose another --node-cidr/--transit", strings.Join(bad, "; "))
	}
	return nil
}
