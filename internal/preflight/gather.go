package preflight

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nldump"
	"github.com/cube-dev/cube/internal/nsrt"
)

// probeOf turns an error into a Probe.
func probeOf(err error) Probe {
	if err != nil {
		return Probe{Err: err.Error()}
	}
	return Probe{OK: true}
}

// GatherOptions says where Gather looks. Zero fields take the host defaults.
type GatherOptions struct {
	// ProcDir is the procfs mount (default /proc). /proc/net is read in the
	// calling process's network namespace: run in the host netns.
	ProcDir string
	// CNIConfDir is the CNI configuration directory (default /etc/cni/net.d).
	CNIConfDir string
	// KVMPath is the KVM device (default /dev/kvm).
	KVMPath string
	// ServerURL, when set, is probed with GET <ServerURL>/health.
	ServerURL string
	// ServerTimeout bounds the probe (default 5s).
	ServerTimeout time.Duration
	// HTTPClient makes the probe (default http.DefaultClient).
	HTTPClient *http.Client
	// UserNSDirs are the directories the user namespace probe makes
	// idmapped mounts of: the node's data dir (templates, sandbox state).
	// Default /var/lib.
	UserNSDirs []string
}

func (o *GatherOptions) defaults() {
	if o.ProcDir == "" {
		o.ProcDir = "/proc"
	}
	if o.CNIConfDir == "" {
		o.CNIConfDir = "/etc/cni/net.d"
	}
	if o.KVMPath == "" {
		o.KVMPath = "/dev/kvm"
	}
	if o.HTTPClient == nil {
		o.HTTPClient = http.DefaultClient
	}
	if len(o.UserNSDirs) == 0 {
		o.UserNSDirs = []string{"/var/lib"}
	}
	if o.ServerTimeout == 0 {
		o.ServerTimeout = 5 * time.Second
	}
}

// Gather reads the facts of the host it runs on. It needs root (netlink,
// unshare) to gather everything; what it cannot read is recorded in the
// facts as an error, so the checks fail with the reason.
func Gather(ctx context.Context, opts GatherOptions) Facts {
	opts.defaults()
	var f Facts
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		f.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	if b, err := os.ReadFile(filepath.Join(opts.ProcDir, "filesystems")); err != nil {
		f.FilesystemsErr = err.Error()
	} else {
		f.Filesystems = ParseFilesystems(string(b))
	}
	gatherNFT(&f)
	gatherCgroups(&f)
	f.NetNS = probeNetNS()
	f.UserNS = probeOf(nsrt.ProbeUserNS(opts.UserNSDirs...))
	f.KVM = probeKVM(opts.KVMPath)
	gatherNetlink(&f)
	gatherListeners(&f, opts.ProcDir)
	f.CNIConfigs = readCNIConfigs(opts.CNIConfDir)
	f.Processes = interestingProcesses(opts.ProcDir)
	f.HostNetNS = ProbeHostNetNS(opts.ProcDir)
	f.PidMax = readInt(filepath.Join(opts.ProcDir, "sys", "kernel", "pid_max"))
	if opts.ServerURL != "" {
		f.Server = probeServer(ctx, opts.HTTPClient, opts.ServerURL, opts.ServerTimeout)
	}
	return f
}

func gatherNFT(f *Facts) {
	c, err := nftables.New()
	if err != nil {
		f.NFTables = Probe{Err: err.Error()}
		return
	}
	tables, err := c.ListTables()
	if err != nil {
		f.NFTables = Probe{Err: fmt.Sprintf("list tables: %v", err)}
		return
	}
	f.NFTables = Probe{OK: true}
	for _, t := range tables {
		f.NFTTables = append(f.NFTTables, familyName(t.Family)+" "+t.Name)
	}
	if chains, err := c.ListChains(); err == nil {
		for _, ch := range chains {
			f.NFTChains = append(f.NFTChains, ch.Table.Name+"/"+ch.Name)
		}
	}
}

func familyName(fam nftables.TableFamily) string {
	switch fam {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", fam)
}

func gatherCgroups(f *Facts) {
	l, err := cgroup.DetectLayout()
	if err != nil {
		f.CgroupErr = err.Error()
		return
	}
	f.CgroupVersion = l.Version.String()
	if l.Version == cgroup.V1 {
		for c := range l.V1 {
			if !strings.HasPrefix(c, "name=") {
				f.CgroupControllers = append(f.CgroupControllers, c)
			}
		}
	} else {
		b, err := os.ReadFile(filepath.Join(l.Unified, "cgroup.controllers"))
		if err != nil {
			f.CgroupErr = err.Error()
			return
		}
		f.CgroupControllers = strings.Fields(string(b))
	}
	slices.Sort(f.CgroupControllers)
}

// probeNetNS creates a network namespace on a locked OS thread and moves
// the thread back. If it cannot move back, the thread stays locked and the
// Go runtime discards it with the goroutine. (Never leave a thread in the
// new netns unrestored: on the main thread the runtime would keep it, and
// /proc/self/net would then show the wrong namespace.)
func probeNetNS() Probe {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open current netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("restore netns: %w", err) // thread stays locked and is discarded
			return
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		return Probe{Err: err.Error()}
	}
	return Probe{OK: true}
}

// kvmGetAPIVersion is the KVM_GET_API_VERSION ioctl; a usable KVM answers 12.
const kvmGetAPIVersion = 0xAE00

// probeKVM reports whether path is a working KVM device, not just a node.
func probeKVM(path string) bool {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	return err == nil && v == 12
}

func gatherNetlink(f *Facts) {
	var err error
	f.Links, f.Routes, err = hostRoutes()
	if err != nil {
		f.RoutesErr = err.Error()
		return
	}
	addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		f.RoutesErr = fmt.Sprintf("list addresses: %v", err)
		return
	}
	for _, a := range addrs {
		if p, ok := netipPrefix(a.IP, a.Mask); ok && !p.Addr().IsLoopback() {
			f.Addrs = append(f.Addrs, p)
		}
	}
}

// hostRoutes returns the link names and the IPv4 routes (default routes
// excluded) of the calling thread's network namespace.
func hostRoutes() ([]string, []Route, error) {
	links, err := nldump.Retry(netlink.LinkList)
	if err != nil {
		return nil, nil, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	var linkNames []string
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
		linkNames = append(linkNames, l.Attrs().Name)
	}
	routes, err := nldump.Retry(func() ([]netlink.Route, error) { return netlink.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return linkNames, nil, fmt.Errorf("list routes: %w", err)
	}
	var out []Route
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		p, ok := netipPrefix(r.Dst.IP, r.Dst.Mask)
		if !ok || p.Bits() == 0 {
			continue
		}
		out = append(out, Route{Dst: p, Dev: names[r.LinkIndex]})
	}
	return linkNames, out, nil
}

func netipPrefix(ip []byte, mask []byte) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones := 0
	for _, b := range mask {
		for ; b != 0; b <<= 1 {
			if b&0x80 == 0 {
				return netip.Prefix{}, false
			}
			ones++
		}
	}
	return netip.PrefixFrom(a, ones), true
}

func gatherListeners(f *Facts, procDir string) {
	socks, err := ReadProcNet(filepath.Join(procDir, "net"))
	for _, s := range socks {
		if s.Accepting() {
			f.Listeners = append(f.Listeners, Listener{Proto: s.Proto, Addr: s.Local})
		}
	}
	if err != nil {
		f.ListenersErr = err.Error()
	}
}

// readCNIConfigs lists the .conf/.conflist/.json files of dir with the
// plugin types they name. A missing dir means no CNI config.
func readCNIConfigs(dir string) []CNIConfig {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []CNIConfig
	for _, e := range ents {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".conf" && ext != ".conflist" && ext != ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		out = append(out, CNIConfig{File: e.Name(), Types: CNITypes(b)})
	}
	return out
}

// CNITypes returns the plugin types a CNI .conf or .conflist names.
func CNITypes(b []byte) []string {
	var doc struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal(b, &doc) != nil {
		return nil
	}
	var out []string
	if doc.Type != "" {
		out = append(out, doc.Type)
	}
	for _, p := range doc.Plugins {
		if p.Type != "" {
			out = append(out, p.Type)
		}
	}
	return out
}

// interestingProcesses returns the command names of running processes that
// the conflict checks know about.
func interestingProcesses(procDir string) []string {
	want := map[string]bool{"kube-proxy": true}
	for _, s := range cniSignatures {
		for _, p := range s.procs {
			want[p] = true
		}
	}
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "comm"))
		if err != nil {
			continue
		}
		if c := strings.TrimSpace(string(b)); want[c] && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

func probeServer(ctx context.Context, c *http.Client, url string, timeout time.Duration) ServerProbe {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/health", nil)
	if err != nil {
		return ServerProbe{Checked: true, Err: err.Error()}
	}
	resp, err := c.Do(req)
	if err != nil {
		return ServerProbe{Checked: true, Err: err.Error()}
	}
	resp.Body.Close()
	return ServerProbe{Checked: true, Status: resp.StatusCode}
}

// readInt reads a file holding one decimal number (a /proc/sys value); 0
// when it cannot.
func readInt(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
}
