package preflight

import (
	"net/netip"
	"strings"
	"testing"
)

// goodFacts is a host that passes every check.
func goodFacts() Facts {
	return Facts{
		Kernel:            "6.18.0",
		Filesystems:       []string{"ext4", "overlay", "proc"},
		NFTables:          Probe{OK: true},
		CgroupVersion:     "v2",
		CgroupControllers: []string{"cpu", "io", "memory", "pids"},
		NetNS:             Probe{OK: true},
		UserNS:            Probe{OK: true},
		HostNetNS:         HostNetNSProbe{Via: "pid 1"},
		Routes: []Route{
			{Dst: netip.MustParsePrefix("10.0.0.0/24"), Dev: "eth0"},
			{Dst: netip.MustParsePrefix("169.254.250.0/30"), Dev: "cube0"},
		},
		Addrs:     []netip.Prefix{netip.MustParsePrefix("10.0.0.5/24")},
		Listeners: []Listener{{Proto: "tcp", Addr: netip.MustParseAddrPort("0.0.0.0:22")}},
		Server:    ServerProbe{Checked: true, Status: 200},
		PidMax:    4194304,
	}
}

func goodConfig() Config {
	c := DefaultConfig()
	c.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	c.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	c.ServerURL = "http://cube-server:3000"
	return c
}

func find(t *testing.T, r Report, name string) Result {
	t.Helper()
	for _, res := range r.Results {
		if res.Name == name {
			return res
		}
	}
	t.Fatalf("no result %q in %+v", name, r.Results)
	return Result{}
}

func TestCheckAllGood(t *testing.T) {
	rep := Check(goodConfig(), goodFacts())
	if !rep.Passed || rep.Runtime != "ns" {
		t.Fatalf("report = %+v", rep)
	}
	for _, r := range rep.Results {
		if r.Status != StatusOK {
			t.Errorf("%s = %s: %s", r.Name, r.Status, r.Message)
		}
	}
}

func TestCheckCases(t *testing.T) {
	cases := []struct {
		name   string
		cfg    func(*Config)
		facts  func(*Facts)
		check  string
		want   Status
		substr string
	}{
		{"no overlay", nil, func(f *Facts) { f.Filesystems = []string{"ext4"} }, "kernel.overlayfs", StatusFail, "modprobe overlay"},
		{"unreadable filesystems", nil, func(f *Facts) { f.FilesystemsErr = "permission denied" }, "kernel.overlayfs", StatusFail, "permission denied"},
		{"nft unusable", nil, func(f *Facts) { f.NFTables = Probe{Err: "operation not permitted"} }, "kernel.nftables", StatusFail, "operation not permitted"},
		{"missing pids controller", nil, func(f *Facts) { f.CgroupControllers = []string{"cpu", "memory"} }, "kernel.cgroups", StatusFail, "pids"},
		{"no cgroup hierarchy", nil, func(f *Facts) { f.CgroupErr = "no cgroup" }, "kernel.cgroups", StatusFail, "no cgroup"},
		{"no netns", nil, func(f *Facts) { f.NetNS = Probe{Err: "EPERM"} }, "kernel.netns", StatusFail, "CONFIG_NET_NS"},
		{"host netns via the shim", nil, func(f *Facts) {
			f.HostNetNS = HostNetNSProbe{Via: "pid 4242 (containerd-shim), an ancestor"}
		}, "host.netns", StatusOK, "containerd-shim"},
		{"pid_max below the address range", nil, func(f *Facts) { f.PidMax = 32768 }, "kernel.pid-max", StatusWarn, "about 1920 sandboxes"},
		{"pid_max enough for a small range", func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("10.9.0.0/24") }, func(f *Facts) { f.PidMax = 32768 },
			"kernel.pid-max", StatusOK, "enough"},
		{"pid_max unknown", nil, func(f *Facts) { f.PidMax = 0 }, "kernel.pid-max", StatusSkip, "unknown"},
		{"no host netns", nil, func(f *Facts) { f.HostNetNS = HostNetNSProbe{Err: "pid 1's cannot be opened"} }, "host.netns", StatusWarn, "cubeNode.hostNetwork=true"},
		{"no userns", nil, func(f *Facts) { f.UserNS = Probe{Err: "ENOSPC"} }, "kernel.userns", StatusWarn, "root inside a sandbox is root on the host"},
		{"kvm chooses vm", nil, func(f *Facts) { f.KVM = true }, "runtime.kvm", StatusOK, "runtime vm"},
		{"vm without kvm", func(c *Config) { c.Runtime = "vm" }, nil, "runtime.kvm", StatusFail, "/dev/kvm"},
		{"ns forced with kvm", func(c *Config) { c.Runtime = "ns" }, func(f *Facts) { f.KVM = true }, "runtime.kvm", StatusOK, "runtime ns"},
		{"bad runtime", func(c *Config) { c.Runtime = "gvisor" }, nil, "runtime.kvm", StatusFail, "auto, ns or vm"},
		{"cidr too small", func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("172.16.0.0/30") }, nil, "network.node-cidr", StatusFail, "/29"},
		{"cidr host bits", func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("172.16.0.1/18") }, nil, "network.node-cidr", StatusFail, "172.16.0.0/18"},
		{"cidr ipv6", func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("fd00::/64") }, nil, "network.node-cidr", StatusFail, "IPv4"},
		{"service overlap", func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("10.96.0.0/18") }, nil, "network.service-cidr", StatusFail, "10.96.0.0/12"},
		{"pod overlap", func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("10.0.0.0/8") }, nil, "network.pod-cidr", StatusFail, "10.244.0.0/16"},
		{"no service cidr", func(c *Config) { c.ServiceCIDRs = nil }, nil, "network.service-cidr", StatusSkip, ""},
		{"route overlap", nil, func(f *Facts) {
			f.Routes = append(f.Routes, Route{Dst: netip.MustParsePrefix("172.16.8.0/24"), Dev: "vpn0"})
		}, "network.routes", StatusWarn, "172.16.8.0/24 dev vpn0"},
		{"address overlap", nil, func(f *Facts) {
			f.Addrs = append(f.Addrs, netip.MustParsePrefix("172.16.1.1/24"))
		}, "network.routes", StatusWarn, "address 172.16.1.1/24"},
		{"own transit route ignored", func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("169.254.0.0/16") }, nil, "network.routes", StatusOK, ""},
		{"routes unreadable", nil, func(f *Facts) { f.RoutesErr = "netlink: EPERM" }, "network.routes", StatusFail, "EPERM"},
		{"listener in range", nil, func(f *Facts) {
			f.Listeners = append(f.Listeners, Listener{"tcp6", netip.MustParseAddrPort("[::]:20080")}, Listener{"udp", netip.MustParseAddrPort("0.0.0.0:29999")})
		}, "network.port-range", StatusFail, "tcp6 [::]:20080, udp 0.0.0.0:29999"},
		{"listener just outside range", nil, func(f *Facts) {
			f.Listeners = append(f.Listeners, Listener{"tcp", netip.MustParseAddrPort("0.0.0.0:19999")}, Listener{"tcp", netip.MustParseAddrPort("0.0.0.0:30000")})
		}, "network.port-range", StatusOK, ""},
		{"bad port range", func(c *Config) { c.PortMin, c.PortMax = 30000, 20000 }, nil, "network.port-range", StatusFail, "invalid"},
		{"nodeport overlap", func(c *Config) { c.PortMax = 30500 }, nil, "network.nodeport-range", StatusWarn, "30000-32767"},
		{"cilium", nil, func(f *Facts) {
			f.CNIConfigs = []CNIConfig{{File: "05-cilium.conflist", Types: []string{"cilium-cni"}}}
			f.Links = []string{"lo", "eth0", "cilium_host"}
		}, "node.cni", StatusWarn, "cilium (config 05-cilium.conflist, link cilium_host)"},
		{"calico link prefix", nil, func(f *Facts) { f.Links = []string{"cali1234"} }, "node.cni", StatusWarn, "skip-interface=cube0"},
		{"bridge cni is fine", nil, func(f *Facts) {
			f.CNIConfigs = []CNIConfig{{File: "10-bridge.conf", Types: []string{"bridge", "portmap"}}}
		}, "node.cni", StatusOK, "1 CNI configs"},
		{"kube-proxy nft mode", nil, func(f *Facts) { f.NFTTables = []string{"ip kube-proxy"} }, "node.kube-proxy", StatusWarn, "nft table ip kube-proxy"},
		{"kube-proxy iptables-nft", nil, func(f *Facts) {
			f.NFTChains = []string{"nat/KUBE-SERVICES", "nat/KUBE-NODEPORTS", "filter/INPUT"}
		}, "node.kube-proxy", StatusWarn, "2 KUBE-* iptables-nft chains"},
		{"kube-proxy process", nil, func(f *Facts) { f.Processes = []string{"kube-proxy"} }, "node.kube-proxy", StatusWarn, "process kube-proxy"},
		{"server down", nil, func(f *Facts) { f.Server = ServerProbe{Checked: true, Err: "connection refused"} }, "server.reachable", StatusFail, "connection refused"},
		{"server unhealthy", nil, func(f *Facts) { f.Server = ServerProbe{Checked: true, Status: 503} }, "server.reachable", StatusFail, "503"},
		{"server not probed", nil, func(f *Facts) { f.Server = ServerProbe{} }, "server.reachable", StatusFail, "not probed"},
		{"no server url", func(c *Config) { c.ServerURL = "" }, nil, "server.reachable", StatusSkip, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, f := goodConfig(), goodFacts()
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			if c.facts != nil {
				c.facts(&f)
			}
			rep := Check(cfg, f)
			got := find(t, rep, c.check)
			if got.Status != c.want || !strings.Contains(got.Message, c.substr) {
				t.Fatalf("%s = %s %q, want %s containing %q", c.check, got.Status, got.Message, c.want, c.substr)
			}
			if wantPass := c.want != StatusFail; rep.Passed != wantPass {
				t.Fatalf("Passed = %v, want %v (failed: %+v)", rep.Passed, wantPass, rep.Failed())
			}
		})
	}
}

func TestStrictTurnsWarningsIntoFailures(t *testing.T) {
	f := goodFacts()
	f.Processes = []string{"kube-proxy"}
	cfg := goodConfig()
	if rep := Check(cfg, f); !rep.Passed || len(rep.Failed()) != 0 {
		t.Fatalf("non-strict: %+v", rep)
	}
	cfg.Strict = true
	rep := Check(cfg, f)
	if rep.Passed || len(rep.Failed()) != 1 || rep.Failed()[0].Name != "node.kube-proxy" {
		t.Fatalf("strict: passed=%v failed=%+v", rep.Passed, rep.Failed())
	}
}
