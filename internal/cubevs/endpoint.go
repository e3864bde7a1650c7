package cubevs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nldump"
)

var errNoDev = unix.ENODEV

// Endpoint is a sandbox's network attachment as the kernel records it.
type Endpoint struct {
	// Owner is the sandbox id (the link alias in the dataplane netns).
	Owner string
	// NetNSPath is the pinned netns file; empty if the pin is missing.
	NetNSPath string
	// IP is the sandbox address; invalid if no route to it exists.
	IP netip.Addr
	// LinkName is the veth inside the dataplane netns; empty if missing.
	LinkName string
}

// Attach gives owner a pinned netns at RunDir/netns/<owner> with loopback up
// and eth0 = ip/32, default route via the gateway, joined by a veth to the
// dataplane netns (link LinkName(owner), alias owner). It is idempotent
// and repairs missing pieces. An ip routed to another owner's link is an
// error wrapping errdefs.ErrConflict. Attach does not open egress; call
// SetEgress (until then the sandbox can only answer mapped connections).
func (d *Dataplane) Attach(ctx context.Context, owner string, ip netip.Addr) (_ Endpoint, err error) {
	if err := d.cfg.validOwner(owner); err != nil {
		return Endpoint{}, err
	}
	if err := d.cfg.validSandboxIP(ip); err != nil {
		return Endpoint{}, err
	}
	unlock, err := d.lock(ctx)
	if err != nil {
		return Endpoint{}, err
	}
	defer unlock()

	name := LinkName(owner)
	if err := d.claimRoute(owner, ip); err != nil {
		return Endpoint{}, err
	}
	pin := d.cfg.sandboxPin(owner)
	existed, err := isPinned(pin)
	if err != nil {
		return Endpoint{}, err
	}
	defer func() {
		if err != nil && !existed {
			// Fresh attach failed half way: undo it all.
			err = errors.Join(err, d.detachLocked(owner))
		}
	}()
	sbNS, err := ensurePinnedNetNS(pin)
	if err != nil {
		return Endpoint{}, fmt.Errorf("attach %s: %w", owner, err)
	}
	defer sbNS.Close()
	sb, err := netlink.NewHandleAt(sbNS)
	if err != nil {
		return Endpoint{}, fmt.Errorf("attach %s: sandbox netlink: %w", owner, err)
	}
	defer sb.Close()

	link, peer, made, err := d.ensureSandboxVeth(owner, sbNS, sb)
	if err != nil {
		return Endpoint{}, fmt.Errorf("attach %s: %w", owner, err)
	}
	if err := d.configureDPSide(link, ip, made); err != nil {
		return Endpoint{}, fmt.Errorf("attach %s: %w", owner, err)
	}
	if err := d.configureSandboxSide(sb, peer, ip); err != nil {
		return Endpoint{}, fmt.Errorf("attach %s: %w", owner, err)
	}
	if err := d.pinNeighbours(sb, link, peer, ip); err != nil {
		return Endpoint{}, fmt.Errorf("attach %s: %w", owner, err)
	}
	return Endpoint{Owner: owner, NetNSPath: pin, IP: ip, LinkName: name}, nil
}

// pinNeighbours writes both ends' ARP entries as permanent: the sandbox's
// address on the dataplane end, the gateway in the sandbox. The kernel's
// neighbour table is one for all network namespaces and refuses new
// learned entries past net.ipv4.neigh.default.gc_thresh3 (1024 by
// default): with ~2000 sandboxes answering at once (every envd checked
// after a restart) ARP failed ("neighbor table overflow") and connections
// hung. Permanent entries are not counted against it (Linux >= 5.0).
func (d *Dataplane) pinNeighbours(sb *netlink.Handle, link, peer netlink.Link, ip netip.Addr) error {
	dpEnd, err := d.dp.LinkByIndex(link.Attrs().Index)
	if err != nil {
		return fmt.Errorf("read %s: %w", link.Attrs().Name, err)
	}
	sbEnd, err := sb.LinkByIndex(peer.Attrs().Index)
	if err != nil {
		return fmt.Errorf("read sandbox %s: %w", sandboxIfName, err)
	}
	if err := d.dp.NeighSet(&netlink.Neigh{LinkIndex: dpEnd.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: ip.AsSlice(), HardwareAddr: sbEnd.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("neighbour %s: %w", ip, err)
	}
	if err := sb.NeighSet(&netlink.Neigh{LinkIndex: sbEnd.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: d.cfg.gateway().AsSlice(), HardwareAddr: dpEnd.Attrs().HardwareAddr}); err != nil {
		return fmt.Errorf("sandbox neighbour %s: %w", d.cfg.gateway(), err)
	}
	return nil
}

// ensureSandboxVeth returns the owner's veth pair (dataplane end, sandbox
// end), creating it or replacing half of a pair; made reports a new pair.
func (d *Dataplane) ensureSandboxVeth(owner string, sbNS netns.NsHandle, sb *netlink.Handle) (link, peer netlink.Link, made bool, err error) {
	name := LinkName(owner)
	link, lerr := d.dp.LinkByName(name)
	if lerr != nil && !isNotFound(lerr) {
		return nil, nil, false, fmt.Errorf("look up %s: %w", name, lerr)
	}
	peer, perr := sb.LinkByName(sandboxIfName)
	if perr != nil && !isNotFound(perr) {
		return nil, nil, false, fmt.Errorf("look up sandbox %s: %w", sandboxIfName, perr)
	}
	if link != nil && link.Attrs().Alias != owner {
		return nil, nil, false, fmt.Errorf("link %s belongs to %q: %w", name, link.Attrs().Alias, errdefs.ErrConflict)
	}
	if link != nil && peer != nil && link.Attrs().ParentIndex == peer.Attrs().Index {
		return link, peer, false, nil
	}
	if link != nil {
		if err := d.dp.LinkDel(link); err != nil && !isNotFound(err) {
			return nil, nil, false, fmt.Errorf("delete stale %s: %w", name, err)
		}
	}
	if peer != nil {
		if err := sb.LinkDel(peer); err != nil && !isNotFound(err) {
			return nil, nil, false, fmt.Errorf("delete stale sandbox %s: %w", sandboxIfName, err)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: d.mtu},
		PeerName:      sandboxIfName,
		PeerNamespace: netlink.NsFd(sbNS),
		PeerMTU:       uint32(d.mtu),
	}
	if err := d.dp.LinkAdd(veth); err != nil {
		return nil, nil, false, fmt.Errorf("create veth %s: %w", name, err)
	}
	link, err = d.dp.LinkByName(name)
	if err != nil {
		return nil, nil, false, fmt.Errorf("look up %s: %w", name, err)
	}
	if err := d.dp.LinkSetAlias(link, owner); err != nil {
		return nil, nil, false, fmt.Errorf("set alias on %s: %w", name, err)
	}
	if peer, err = sb.LinkByName(sandboxIfName); err != nil {
		return nil, nil, false, fmt.Errorf("look up sandbox %s: %w", sandboxIfName, err)
	}
	return link, peer, true, nil
}

// configureDPSide brings the dataplane end up with a /32 route to ip and no
// route to anything else. A link just made has no routes to remove: the
// listing is skipped then, since the kernel dumps every route of the
// dataplane namespace (one per sandbox) for it.
func (d *Dataplane) configureDPSide(link netlink.Link, ip netip.Addr, made bool) error {
	if err := d.dp.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", link.Attrs().Name, err)
	}
	var routes []netlink.Route
	if !made {
		var err error
		routes, err = nldump.Retry(func() ([]netlink.Route, error) { return d.dp.RouteList(link, netlink.FAMILY_V4) })
		if err != nil {
			return fmt.Errorf("list routes of %s: %w", link.Attrs().Name, err)
		}
	}
	want := hostIPNet(ip)
	for _, r := range routes {
		if r.Dst != nil && r.Dst.String() != want.String() {
			if err := d.dp.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("delete stale route %s: %w", r.Dst, err)
			}
		}
	}
	rt := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: want, Scope: netlink.SCOPE_LINK}
	if err := d.dp.RouteReplace(rt); err != nil {
		return fmt.Errorf("route %s via %s: %w", ip, link.Attrs().Name, err)
	}
	return nil
}

// configureSandboxSide sets lo and eth0 up, eth0 = ip/32 only, and the
// default route via the gateway (on-link).
func (d *Dataplane) configureSandboxSide(sb *netlink.Handle, peer netlink.Link, ip netip.Addr) error {
	lo, err := sb.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("sandbox lo: %w", err)
	}
	for _, l := range []netlink.Link{lo, peer} {
		if err := sb.LinkSetUp(l); err != nil {
			return fmt.Errorf("set sandbox %s up: %w", l.Attrs().Name, err)
		}
	}
	want := hostIPNet(ip)
	addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return sb.AddrList(peer, netlink.FAMILY_V4) })
	if err != nil {
		return fmt.Errorf("list sandbox addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IPNet.String() != want.String() {
			if err := sb.AddrDel(peer, &a); err != nil {
				return fmt.Errorf("delete stale sandbox address %s: %w", a.IPNet, err)
			}
		}
	}
	if err := sb.AddrReplace(peer, &netlink.Addr{IPNet: want}); err != nil {
		return fmt.Errorf("sandbox address %s: %w", ip, err)
	}
	def := &netlink.Route{LinkIndex: peer.Attrs().Index, Gw: d.cfg.gateway().AsSlice(),
		Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Flags: int(netlink.FLAG_ONLINK)}
	if err := sb.RouteReplace(def); err != nil {
		return fmt.Errorf("sandbox default route: %w", err)
	}
	return nil
}

// claimRoute makes sure ip/32 is routed to no other owner's link before
// owner attaches with it. A link whose owner's netns is no longer pinned
// was detached and is on its way out with that netns (see Detach), or was
// left by a netns a surviving process keeps alive: it is deleted here, so a
// create never fails on it. A link of a live (pinned) owner is a conflict.
func (d *Dataplane) claimRoute(owner string, ip netip.Addr) error {
	link, other, err := d.routeOwner(ip)
	if err != nil || link == "" || link == LinkName(owner) {
		return err
	}
	if other == "" || d.cfg.validOwner(other) != nil {
		return fmt.Errorf("attach %q: ip %s is routed to link %s, which no owner claims: %w",
			owner, ip, link, errdefs.ErrConflict)
	}
	if pinned, err := isPinned(d.cfg.sandboxPin(other)); err != nil {
		return fmt.Errorf("attach %q: %w", owner, err)
	} else if pinned {
		return fmt.Errorf("attach %q: ip %s is routed to link %s owned by %q; detach %q first: %w",
			owner, ip, link, other, other, errdefs.ErrConflict)
	}
	l, err := d.dp.LinkByName(link)
	if err != nil {
		if isNotFound(err) {
			return nil // gone meanwhile
		}
		return fmt.Errorf("attach %q: look up %s: %w", owner, link, err)
	}
	if err := deleteLink(d.dp, l); err != nil {
		return fmt.Errorf("attach %q: %w", owner, err)
	}
	return nil
}

// routeOwner returns the dataplane link that ip/32 is routed to (in the
// main table) and that link's owner (alias), or "", "". It asks the kernel
// for the route that matches ip (RTM_F_FIB_MATCH: the table entry, not the
// resolved next hop) instead of dumping every route: one lookup, whatever
// the number of sandboxes, under the dataplane lock of every attach and
// mapping.
func (d *Dataplane) routeOwner(ip netip.Addr) (link, owner string, err error) {
	routes, err := d.dp.RouteGetWithOptions(ip.AsSlice(), &netlink.RouteGetOptions{FIBMatch: true})
	if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("look up route to %s: %w", ip, err)
	}
	for _, r := range routes {
		if !isHostRoute(r, ip) {
			continue
		}
		if l, err := d.dp.LinkByIndex(r.LinkIndex); err == nil {
			return l.Attrs().Name, l.Attrs().Alias, nil
		}
	}
	return "", "", nil
}

// isHostRoute reports whether r is the main table's route for ip/32.
func isHostRoute(r netlink.Route, ip netip.Addr) bool {
	if r.Dst == nil || (r.Table != 0 && r.Table != unix.RT_TABLE_MAIN) {
		return false
	}
	ones, bits := r.Dst.Mask.Size()
	dst, ok := netip.AddrFromSlice(r.Dst.IP)
	return ok && ones == 32 && bits == 32 && dst.Unmap() == ip
}

// Detach removes owner's mappings, egress chain, veth pair and netns pin,
// in that order (the pin, the anchor, goes last), all before it returns
// (sweeps of orphans, undoing a failed create). Missing pieces are fine;
// failures do not stop later steps and are returned joined.
//
// Only the nftables part runs under the dataplane lock. Deleting the veth
// pair waits for RCU grace periods in the kernel (24-30 ms), and under the
// lock every mapping, attach and detach queued behind it; it runs after
// the lock on a netlink socket of its own. The owner's name and IP stay
// unused meanwhile: the caller (the cubelet, under the sandbox's lock)
// forgets the owner only after Detach returns.
func (d *Dataplane) Detach(ctx context.Context, owner string) error {
	return d.detachOwner(ctx, owner, nil, false)
}

// Release is Detach for a killed sandbox: it also deletes the mappings of
// hostPorts, whoever owns them, in the same nftables transaction as owner's
// objects (one commit per kill instead of one per port plus one), and it
// leaves the veth pair to the kernel when owner's netns is pinned.
// Unpinning the netns lets the kernel destroy it once its last process is
// gone, and the veth pair with it (its sandbox end lives there), in a
// worker of its own that batches the namespaces dying together. Deleting
// the pair here cost 24-30 ms of every kill (p50, one kill at a time);
// unpinning takes well under a millisecond and the pair is gone ~35 ms
// later. Until then its /32 route still names owner's link: the allocator
// hands a freed address out again only after every other free one (ipam,
// next fit), and Attach deletes the link of an owner whose netns is no
// longer pinned should it still meet one (a netns kept alive by a process
// that outlived the kill). A link without a pinned netns is deleted here:
// nothing else would.
func (d *Dataplane) Release(ctx context.Context, owner string, hostPorts []uint16) error {
	return d.detachOwner(ctx, owner, hostPorts, true)
}

func (d *Dataplane) detachOwner(ctx context.Context, owner string, hostPorts []uint16, linkWithNetNS bool) error {
	if err := d.cfg.validOwner(owner); err != nil {
		return err
	}
	unlock, err := d.lock(ctx)
	if err != nil {
		return err
	}
	return d.detach(owner, hostPorts, unlock, linkWithNetNS)
}

// detachLocked is Detach for a caller holding the dataplane lock (a failed
// Attach undoing itself): everything happens under the lock.
func (d *Dataplane) detachLocked(owner string) error { return d.detach(owner, nil, nil, false) }

// detach removes owner's nftables objects, then its veth pair and netns
// pin. With unlock set, the caller's dataplane lock is released after the
// nftables part and the veth pair is deleted on a netlink handle of its
// own. With linkWithNetNS, a veth pair whose netns is pinned is left to
// go with it (see Release).
func (d *Dataplane) detach(owner string, hostPorts []uint16, unlock func(), linkWithNetNS bool) error {
	errs := []error{d.removeOwnerNFT(owner, hostPorts)}
	link, err := d.ownedLink(owner)
	errs = append(errs, err)
	pin := d.cfg.sandboxPin(owner)
	if link != nil && linkWithNetNS {
		if pinned, err := isPinned(pin); err != nil {
			errs = append(errs, err)
		} else if pinned {
			link = nil
		}
	}
	h := d.dp
	if unlock != nil {
		if link != nil {
			if h, err = netlink.NewHandleAt(d.dpNS); err != nil {
				errs = append(errs, fmt.Errorf("netlink handle: %w", err))
				link = nil
			} else {
				defer h.Close()
			}
		}
		unlock()
	}
	if link != nil {
		errs = append(errs, deleteLink(h, link))
	}
	errs = append(errs, unpinNetNS(pin))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach %s: %w", owner, err)
	}
	return nil
}

// ownedLink returns owner's veth in the dataplane, or nil when there is
// none. A link of that name whose alias names another owner is a conflict
// and is left in place.
func (d *Dataplane) ownedLink(owner string) (netlink.Link, error) {
	name := LinkName(owner)
	l, err := d.dp.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("look up link %s: %w", name, err)
	}
	if a := l.Attrs().Alias; a != owner && a != "" {
		return nil, fmt.Errorf("link %s belongs to %q; left in place: %w", name, a, errdefs.ErrConflict)
	}
	return l, nil
}

// deleteLink deletes l (and its peer) through h; a link already gone is fine.
func deleteLink(h *netlink.Handle, l netlink.Link) error {
	if err := h.LinkDel(l); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete link %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// Endpoints lists attachments found in the kernel: every cv* veth in the
// dataplane netns (owner from its alias, IP from its /32 route) and every
// pinned sandbox netns, including half-made ones, sorted by owner.
func (d *Dataplane) Endpoints(ctx context.Context) ([]Endpoint, error) {
	unlock, err := d.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	byOwner := map[string]*Endpoint{}
	links, err := nldump.Retry(d.dp.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list dataplane links: %w", err)
	}
	// One route dump for all links: a per-link RouteList dumps the whole
	// table each time (filtered in user space), quadratic in sandboxes.
	routes, err := nldump.Retry(func() ([]netlink.Route, error) { return d.dp.RouteList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list dataplane routes: %w", err)
	}
	hostRoute := map[int]netip.Addr{} // link index -> its /32 sandbox route
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 32 {
			hostRoute[r.LinkIndex], _ = netip.AddrFromSlice(r.Dst.IP.To4())
		}
	}
	for _, l := range links {
		a := l.Attrs()
		if _, ok := l.(*netlink.Veth); !ok || !strings.HasPrefix(a.Name, "cv") || a.Alias == "" {
			continue
		}
		byOwner[a.Alias] = &Endpoint{Owner: a.Alias, LinkName: a.Name, IP: hostRoute[a.Index]}
	}
	entries, err := os.ReadDir(d.cfg.netnsDir())
	if err != nil {
		return nil, fmt.Errorf("list netns pins: %w", err)
	}
	for _, e := range entries {
		if e.Name() == d.cfg.DPName {
			continue
		}
		path := d.cfg.sandboxPin(e.Name())
		if ok, _ := isPinned(path); !ok {
			continue
		}
		if byOwner[e.Name()] == nil {
			byOwner[e.Name()] = &Endpoint{Owner: e.Name()}
		}
		byOwner[e.Name()].NetNSPath = path
	}
	out := make([]Endpoint, 0, len(byOwner))
	for _, ep := range byOwner {
		out = append(out, *ep)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Owner < out[j].Owner })
	return out, nil
}

func hostIPNet(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}
}
