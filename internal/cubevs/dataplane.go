// Package cubevs is Cube's node networking: a persistent dataplane network
// namespace (cube-dp) pinned under RunDir, joined to the host by one veth
// pair; one pinned netns + veth + IP per sandbox inside it; nftables port
// maps whose elements carry their owner; and per-sandbox egress policy.
//
// The host only ever sees one link, one /30 route and a handful of nft
// rules; the sandbox CIDR is routed inside the dataplane netns alone. All
// state lives in the kernel (pins, links, link aliases, nft elements with
// owner comments), so a fresh Open after a crash or restart adopts it. A
// handle caches the per-sandbox nftables objects by owner (mirror.go), read
// from the kernel once, so a kill deletes by key instead of listing.
package cubevs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"sync"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nldump"
)

// Dataplane is an open handle on one node's dataplane. Its methods are safe
// for concurrent use; a single process should own a dataplane at a time.
type Dataplane struct {
	cfg  Config
	mtu  int
	mu   sync.Mutex
	done bool

	hostNS, dpNS netns.NsHandle
	host, dp     *netlink.Handle
	nft          *nftables.Conn // long-lived, into dpNS; see dpConn
	// nftm mirrors the per-sandbox nftables objects (nil: not read yet, or
	// dropped with nft after a failed operation); see mirror.
	nftm *nftMirror
}

// Open creates or adopts the dataplane described by cfg: the pinned netns,
// the host veth pair with the transit addresses, sysctls (net.ipv4.ip_forward
// on the host and in the dataplane, route_localnet on HostVeth) and both
// nftables tables. It is idempotent and keeps existing sandboxes, mappings
// and egress policies.
func Open(ctx context.Context, cfg Config) (_ *Dataplane, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d := &Dataplane{cfg: cfg, hostNS: netns.None(), dpNS: netns.None()}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if cfg.HostNetNSPath != "" {
		d.hostNS, err = netns.GetFromPath(cfg.HostNetNSPath)
	} else {
		d.hostNS, err = netns.Get()
	}
	if err != nil {
		return nil, fmt.Errorf("open host netns: %w", err)
	}
	if d.host, err = netlink.NewHandleAt(d.hostNS); err != nil {
		return nil, fmt.Errorf("host netlink: %w", err)
	}
	// Before making anything: a refused Open leaves nothing behind.
	if err := d.checkTransitFree(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.netnsDir(), 0o755); err != nil {
		return nil, fmt.Errorf("open dataplane: %w", err)
	}
	if d.dpNS, err = ensurePinnedNetNS(cfg.dpPin()); err != nil {
		return nil, fmt.Errorf("open dataplane: %w", err)
	}
	if d.dp, err = netlink.NewHandleAt(d.dpNS); err != nil {
		return nil, fmt.Errorf("dataplane netlink: %w", err)
	}
	d.mtu = cfg.MTU
	if d.mtu == 0 {
		d.mtu = d.defaultRouteMTU()
	}
	if err := d.ensureUplink(); err != nil {
		return nil, err
	}
	if err := writeSysctls(d.hostNS, map[string]string{
		"net/ipv4/ip_forward":                               "1",
		"net/ipv4/conf/" + cfg.HostVeth + "/route_localnet": "1",
	}); err != nil {
		return nil, fmt.Errorf("host sysctls: %w", err)
	}
	if err := writeSysctls(d.dpNS, map[string]string{"net/ipv4/ip_forward": "1"}); err != nil {
		return nil, fmt.Errorf("dataplane sysctls: %w", err)
	}
	// The dataplane carries IPv4 only (sandboxes have no IPv6 routes out).
	// With IPv6 on, each sandbox's link there got a link-local address and
	// routes, and bringing a link up or down walked the namespace's whole
	// IPv6 table: with 2000 sandboxes, a tenth of the node's CPU in creates
	// and kills. Sandboxes keep IPv6 in their own namespaces (::1).
	if err := writeSysctls(d.dpNS, map[string]string{
		"net/ipv6/conf/all/disable_ipv6":     "1",
		"net/ipv6/conf/default/disable_ipv6": "1",
	}); err != nil && !errors.Is(err, fs.ErrNotExist) { // a kernel without IPv6
		return nil, fmt.Errorf("dataplane sysctls: %w", err)
	}
	if err := d.ensureHostTable(); err != nil {
		return nil, err
	}
	hostAddrs, err := d.hostAddrs()
	if err != nil {
		return nil, err
	}
	if err := d.ensureDPTable(hostAddrs, resolvers()); err != nil {
		return nil, err
	}
	return d, nil
}

// Config returns the configuration the dataplane was opened with.
func (d *Dataplane) Config() Config { return d.cfg }

// DialAddr returns the transit address at which the host reaches a mapped
// host port without going through the host's DNAT ("transitPeer:hostPort").
func (d *Dataplane) DialAddr(hostPort uint16) string {
	return netip.AddrPortFrom(d.DialHost(), hostPort).String()
}

// DialHost is the address at which this node's host ports are dialled from
// the host netns (the dataplane's end of the transit link).
func (d *Dataplane) DialHost() netip.Addr { return d.cfg.transitPeer() }

// Close releases the handles. Kernel state stays; use Destroy to remove it.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closeLocked()
	return nil
}

func (d *Dataplane) closeLocked() {
	d.dropNFT()
	if d.host != nil {
		d.host.Close()
		d.host = nil
	}
	if d.dp != nil {
		d.dp.Close()
		d.dp = nil
	}
	if d.hostNS.IsOpen() {
		d.hostNS.Close()
	}
	if d.dpNS.IsOpen() {
		d.dpNS.Close()
	}
	d.hostNS, d.dpNS = netns.None(), netns.None()
	d.done = true
}

// lock takes the dataplane mutex and fails on a closed dataplane.
func (d *Dataplane) lock(ctx context.Context) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.done {
		d.mu.Unlock()
		return nil, fmt.Errorf("cubevs: dataplane closed: %w", errdefs.ErrFailedPrecondition)
	}
	return d.mu.Unlock, nil
}

// Destroy removes everything this dataplane made: sandbox links and pins,
// both nftables tables, the host veth pair and the dataplane pin, then
// closes the handle. It keeps going past failures and returns them joined.
// net.ipv4.ip_forward on the host is left as it is.
func (d *Dataplane) Destroy(ctx context.Context) error {
	unlock, err := d.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	if c, err := d.dpConn(); err != nil {
		errs = append(errs, err)
	} else if err := deleteTableIfExists(c, d.table()); err != nil {
		errs = append(errs, err)
	}
	d.dropNFT()
	if links, err := nldump.Retry(d.dp.LinkList); err != nil {
		errs = append(errs, fmt.Errorf("list dataplane links: %w", err))
	} else {
		for _, l := range links {
			if _, ok := l.(*netlink.Veth); ok {
				if err := d.dp.LinkDel(l); err != nil && !isNotFound(err) {
					errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
				}
			}
		}
	}
	if err := d.deleteHostVeth(); err != nil {
		errs = append(errs, err)
	}
	if c, err := nftablesIn(d.hostNS); err != nil {
		errs = append(errs, err)
	} else if err := deleteTableIfExists(c, d.table()); err != nil {
		errs = append(errs, err)
	}
	entries, err := os.ReadDir(d.cfg.netnsDir())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list netns pins: %w", err))
	}
	for _, e := range entries {
		if e.Name() != d.cfg.DPName {
			errs = append(errs, unpinNetNS(d.cfg.sandboxPin(e.Name())))
		}
	}
	d.closeLocked()
	errs = append(errs, unpinNetNS(d.cfg.dpPin()))
	if err := os.Remove(d.cfg.netnsDir()); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove %s: %w", d.cfg.netnsDir(), err))
	}
	return errors.Join(errs...)
}

// hostVethAlias marks HostVeth as ours, naming the dataplane pin.
func (d *Dataplane) hostVethAlias() string { return "cubevs " + d.cfg.dpPin() }

// ensureUplink creates or adopts the host<->dataplane veth pair and sets
// the transit addresses, the dataplane default route and the gateway.
func (d *Dataplane) ensureUplink() error {
	hostLink, herr := d.host.LinkByName(d.cfg.HostVeth)
	upLink, uerr := d.dp.LinkByName(uplinkName)
	if herr != nil && !isNotFound(herr) {
		return fmt.Errorf("look up host link %s: %w", d.cfg.HostVeth, herr)
	}
	if uerr != nil && !isNotFound(uerr) {
		return fmt.Errorf("look up dataplane uplink: %w", uerr)
	}
	if hostLink != nil && hostLink.Attrs().Alias != d.hostVethAlias() {
		return fmt.Errorf("host link %s exists and is not this dataplane's (alias %q): choose another HostVeth or remove it: %w",
			d.cfg.HostVeth, hostLink.Attrs().Alias, errdefs.ErrConflict)
	}
	paired := hostLink != nil && upLink != nil && hostLink.Attrs().ParentIndex == upLink.Attrs().Index
	if !paired {
		// Half a pair (a crash, or a recreated dataplane netns): start over.
		if hostLink != nil {
			if err := d.host.LinkDel(hostLink); err != nil && !isNotFound(err) {
				return fmt.Errorf("delete stale host link %s: %w", d.cfg.HostVeth, err)
			}
		}
		if upLink != nil {
			if err := d.dp.LinkDel(upLink); err != nil && !isNotFound(err) {
				return fmt.Errorf("delete stale uplink: %w", err)
			}
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: d.cfg.HostVeth, MTU: d.mtu},
			PeerName:      uplinkName,
			PeerNamespace: netlink.NsFd(d.dpNS),
			PeerMTU:       uint32(d.mtu),
		}
		if err := d.host.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth %s: %w", d.cfg.HostVeth, err)
		}
		var err error
		if hostLink, err = d.host.LinkByName(d.cfg.HostVeth); err != nil {
			return fmt.Errorf("look up host link %s: %w", d.cfg.HostVeth, err)
		}
		if err := d.host.LinkSetAlias(hostLink, d.hostVethAlias()); err != nil {
			return fmt.Errorf("set alias on %s: %w", d.cfg.HostVeth, err)
		}
		if upLink, err = d.dp.LinkByName(uplinkName); err != nil {
			return fmt.Errorf("look up dataplane uplink: %w", err)
		}
	}
	bits := d.cfg.Transit.Bits()
	if err := d.host.AddrReplace(hostLink, addr(d.cfg.transitHost(), bits)); err != nil {
		return fmt.Errorf("address %s: %w", d.cfg.HostVeth, err)
	}
	if err := d.dp.AddrReplace(upLink, addr(d.cfg.transitPeer(), bits)); err != nil {
		return fmt.Errorf("address uplink: %w", err)
	}
	lo, err := d.dp.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("dataplane lo: %w", err)
	}
	if err := d.dp.AddrReplace(lo, addr(d.cfg.gateway(), 32)); err != nil {
		return fmt.Errorf("gateway address: %w", err)
	}
	for _, h := range []struct {
		h *netlink.Handle
		l netlink.Link
	}{{d.host, hostLink}, {d.dp, upLink}, {d.dp, lo}} {
		if err := h.h.LinkSetUp(h.l); err != nil {
			return fmt.Errorf("set %s up: %w", h.l.Attrs().Name, err)
		}
	}
	def := &netlink.Route{LinkIndex: upLink.Attrs().Index, Gw: d.cfg.transitHost().AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}
	if err := d.dp.RouteReplace(def); err != nil {
		return fmt.Errorf("dataplane default route: %w", err)
	}
	return nil
}

func (d *Dataplane) deleteHostVeth() error {
	l, err := d.host.LinkByName(d.cfg.HostVeth)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("look up host link %s: %w", d.cfg.HostVeth, err)
	}
	if l.Attrs().Alias != d.hostVethAlias() {
		return fmt.Errorf("host link %s is not this dataplane's (alias %q); left in place: %w",
			d.cfg.HostVeth, l.Attrs().Alias, errdefs.ErrConflict)
	}
	if err := d.host.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete host link %s: %w", d.cfg.HostVeth, err)
	}
	return nil
}

// hostAddrs lists the host's IPv4 addresses (sandboxes may not reach them).
func (d *Dataplane) hostAddrs() ([]netip.Addr, error) {
	addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return d.host.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if ok && !seen[ip] && !ip.IsLoopback() {
			seen[ip] = true
			out = append(out, ip)
		}
	}
	return out, nil
}

// defaultRouteMTU is the MTU of the host's default-route link, or 1500.
func (d *Dataplane) defaultRouteMTU() int {
	routes, err := nldump.Retry(func() ([]netlink.Route, error) { return d.host.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return 1500
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if l, err := d.host.LinkByIndex(r.LinkIndex); err == nil && l.Attrs().MTU >= 576 {
			return l.Attrs().MTU
		}
	}
	return 1500
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
}

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, os.ErrNotExist) || errors.Is(err, errNoDev)
}

// checkTransitFree refuses a transit subnet that the host already routes
// through another link (another Cube dataplane, a VPN, a bridge): host
// traffic to the dataplane would go there instead.
func (d *Dataplane) checkTransitFree() error {
	routes, err := nldump.Retry(func() ([]netlink.Route, error) { return d.host.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("list host routes: %w", err)
	}
	own := -1
	if l, err := d.host.LinkByName(d.cfg.HostVeth); err == nil {
		own = l.Attrs().Index
	}
	for _, r := range routes {
		if r.Dst == nil || r.LinkIndex == own {
			continue
		}
		p, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		if ones == 0 {
			continue // the default route
		}
		if netip.PrefixFrom(p, ones).Overlaps(d.cfg.Transit) {
			name := fmt.Sprint(r.LinkIndex)
			if l, err := d.host.LinkByIndex(r.LinkIndex); err == nil {
				name = l.Attrs().Name
			}
			return fmt.Errorf("transit subnet %s overlaps the host route %s via %s: choose another --transit: %w",
				d.cfg.Transit, r.Dst, name, errdefs.ErrConflict)
		}
	}
	return nil
}
