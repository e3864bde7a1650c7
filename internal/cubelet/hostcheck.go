package cubelet

import (
	"bufio"
	"bytes"
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
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nldump"
)

// Check is the outcome of one preflight check of the host.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Preflight checks that the host can run this node: nftables usable,
// overlayfs available, cgroup controllers memory/pids/cpu present, IPv4
// forwarding on (once the dataplane exists), the netns pin dir usable, the
// envd binary present, no host listener in the mapped port range and no
// host route overlapping the node CIDR or the transit subnet. It changes
// nothing.
func Preflight(cfg Config) []Check {
	var out []Check
	add := func(name string, err error, okDetail string) {
		c := Check{Name: name, OK: err == nil, Detail: okDetail}
		if err != nil {
			c.Detail = err.Error()
		}
		out = append(out, c)
	}
	host, herr := hostNetNS(cfg)
	if herr == nil {
		defer host.Close()
	}
	withHost := func(fn func() error) error {
		if herr != nil {
			return herr
		}
		return inHostNS(host, fn)
	}
	add("nftables", withHost(checkNftables), "nf_tables answers")
	add("overlayfs", checkOverlay(), "overlay in /proc/filesystems")
	add("cgroup-controllers", checkCgroups(), "memory, pids and cpu present")
	add("ip-forward", withHost(func() error { return checkForward(cfg) }), "")
	add("netns-pin-dir", checkPinDir(cfg), filepath.Join(cfg.Network.RunDir, "netns"))
	add("envd", checkEnvd(cfg.EnvdPath), cfg.EnvdPath)
	add("port-range", withHost(func() error { return checkPorts(cfg.Network.PortMin, cfg.Network.PortMax) }),
		fmt.Sprintf("no host listener in %d-%d", cfg.Network.PortMin, cfg.Network.PortMax))
	add("routes", withHost(func() error { return checkRoutes(cfg) }),
		fmt.Sprintf("no host route overlaps %s or %s", cfg.Network.NodeCIDR, cfg.Network.Transit))
	return out
}

func hostNetNS(cfg Config) (netns.NsHandle, error) {
	if cfg.Network.HostNetNSPath != "" {
		return netns.GetFromPath(cfg.Network.HostNetNSPath)
	}
	return netns.Get()
}

// inHostNS runs fn on an OS thread switched into ns, so per-netns files
// under /proc/thread-self/net and /proc/sys/net show the host's view.
func inHostNS(ns netns.NsHandle, fn func() error) error { return cubevs.InNetNS(ns, fn) }

func checkNftables() error {
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

func checkOverlay() error {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == "overlay" {
			return nil
		}
	}
	return errors.New("overlay is not in /proc/filesystems (load the overlay module)")
}

func checkCgroups() error {
	l, err := cgroup.DetectLayout()
	if err != nil {
		return err
	}
	need := []string{"memory", "pids", "cpu"}
	var have []string
	if l.Version == cgroup.V2 {
		b, err := os.ReadFile(filepath.Join(l.Unified, "cgroup.controllers"))
		if err != nil {
			return err
		}
		have = strings.Fields(string(b))
	} else {
		for c := range l.V1 {
			have = append(have, c)
		}
	}
	var missing []string
	for _, c := range need {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cgroup %s controllers missing: %s", l.Version, strings.Join(missing, ", "))
	}
	return nil
}

// checkForward runs in the host netns: forwarding must be on once the
// dataplane exists (Open turns it on; something turned it off since).
func checkForward(cfg Config) error {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if ok, _ := pinExists(cfg.Network.DataplanePin()); !ok {
		return nil // cube turns it on when it creates the dataplane
	}
	return errors.New("net.ipv4.ip_forward is 0 on the host although the dataplane exists: traffic from other hosts cannot reach sandboxes; set it to 1")
}

func checkPinDir(cfg Config) error {
	dir := filepath.Join(cfg.Network.RunDir, "netns")
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
	if ok, err := pinExists(cfg.Network.DataplanePin()); err == nil && !ok {
		if _, serr := os.Stat(cfg.Network.DataplanePin()); serr == nil {
			return fmt.Errorf("%s exists but is not a mounted netns (a crash during creation; cube repairs it at start)", cfg.Network.DataplanePin())
		}
	}
	return nil
}

func pinExists(path string) (bool, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	return bytes.Contains(b, []byte(" "+path+" ")), nil
}

func checkEnvd(path string) error {
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

// checkPorts runs in the host netns and looks for TCP listeners and bound
// UDP sockets in [min, max]: the host DNATs that whole range to sandboxes,
// so such a listener is unreachable on the host's addresses.
func checkPorts(min, max uint16) error {
	var busy []string
	for _, f := range []string{"tcp", "tcp6", "udp", "udp6"} {
		ports, err := boundPorts(filepath.Join("/proc/thread-self/net", f), strings.HasPrefix(f, "tcp"))
		if err != nil {
			continue // no IPv6, for one
		}
		for _, p := range ports {
			if p >= min && p <= max {
				busy = append(busy, f+"/"+strconv.Itoa(int(p)))
			}
		}
	}
	if len(busy) > 0 {
		slices.Sort(busy)
		busy = slices.Compact(busy)
		return fmt.Errorf("host sockets listen in the mapped port range: %s; choose another --port-range or move them", strings.Join(busy, ", "))
	}
	return nil
}

// boundPorts parses a /proc/net/{tcp,udp}[6] table: TCP sockets in LISTEN
// (0A), UDP sockets in any state.
func boundPorts(path string, tcp bool) ([]uint16, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSockTable(f, tcp), nil
}

func parseSockTable(r interface{ Read([]byte) (int, error) }, tcp bool) []uint16 {
	var out []uint16
	sc := bufio.NewScanner(r)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		if tcp && f[3] != "0A" {
			continue
		}
		_, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(portHex, 16, 16); err == nil {
			out = append(out, uint16(p))
		}
	}
	return out
}

// checkRoutes runs in the host netns: no route other than Cube's own
// transit route may overlap the node CIDR or the transit subnet.
func checkRoutes(cfg Config) error {
	routes, err := nldump.Retry(func() ([]netlink.Route, error) { return netlink.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("list host routes: %w", err)
	}
	var bad []string
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		addr, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok || ones == 0 {
			continue
		}
		dst := netip.PrefixFrom(addr, ones)
		dev := ""
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		if dev == cfg.Network.HostVeth {
			continue
		}
		for _, p := range []netip.Prefix{cfg.Network.NodeCIDR, cfg.Network.Transit} {
			if p.IsValid() && dst.Overlaps(p) {
				bad = append(bad, fmt.Sprintf("%s dev %s overlaps %s", dst, dev, p))
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("host routes overlap Cube's ranges: %s; choose another --node-cidr/--transit", strings.Join(bad, "; "))
	}
	return nil
}
