package cubevs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nldump"
)

func TestDataplaneLifecycle(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	linksBefore := hostLinkNames(t)

	d := openDP(t, cfg)
	d2, err := Open(ctx, cfg) // idempotent: adopts everything
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	d2.Close()

	ipA, ipB := cfg.NodeCIDR.Addr().Next().Next(), cfg.NodeCIDR.Addr().Next().Next().Next()
	epA, err := d.Attach(ctx, "sbx-alpha", ipA)
	if err != nil {
		t.Fatalf("Attach A: %v", err)
	}
	if _, err := d.Attach(ctx, "sbx-alpha", ipA); err != nil {
		t.Fatalf("Attach A again (idempotent): %v", err)
	}
	epB, err := d.Attach(ctx, "sbx-bravo-with-a-long-id-0123456789", ipB)
	if err != nil {
		t.Fatalf("Attach B: %v", err)
	}
	if _, err := d.Attach(ctx, "sbx-charlie", ipA); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Attach with A's ip: err = %v, want ErrConflict", err)
	}
	if _, err := d.Attach(ctx, "../evil", ipA); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Attach bad id: err = %v, want ErrInvalidArgument", err)
	}
	if _, err := d.Attach(ctx, "sbx-x", cfg.gateway()); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Attach gateway ip: err = %v, want ErrInvalidArgument", err)
	}
	for _, ep := range []Endpoint{epA, epB} {
		if err := d.SetEgress(ctx, ep.Owner, ep.IP, EgressPolicy{AllowInternet: true, AllowOut: []netip.Prefix{cfg.NodeCIDR}}); err != nil {
			t.Fatalf("SetEgress %s: %v", ep.Owner, err)
		}
	}

	// The host sees exactly one new link and no route to the sandboxes.
	var newLinks []string
	for n := range hostLinkNames(t) {
		if !linksBefore[n] && (n == cfg.HostVeth || strings.HasPrefix(n, "cv") && !strings.HasPrefix(n, "cvt")) {
			newLinks = append(newLinks, n)
		}
	}
	if len(newLinks) != 1 || newLinks[0] != cfg.HostVeth {
		t.Errorf("new host links = %v, want [%s]", newLinks, cfg.HostVeth)
	}
	routes, err := nldump.Retry(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst != nil {
			if p, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && cfg.NodeCIDR.Contains(p) {
				t.Errorf("host has a route into the node CIDR: %v", r)
			}
		}
	}

	serveTag(t, epA.NetNSPath, "0.0.0.0:8080", "A")
	serveTag(t, epB.NetNSPath, "0.0.0.0:8080", "B")
	hpA, hpB := cfg.PortMin+1, cfg.PortMin+2
	mA := Mapping{Owner: epA.Owner, HostPort: hpA, SandboxIP: ipA, GuestPort: 8080}
	mB := Mapping{Owner: epB.Owner, HostPort: hpB, SandboxIP: ipB, GuestPort: 8080}
	for _, m := range []Mapping{mA, mA, mB} {
		if err := d.AddMapping(ctx, m); err != nil {
			t.Fatalf("AddMapping %+v: %v", m, err)
		}
	}
	err = d.AddMapping(ctx, Mapping{Owner: epB.Owner, HostPort: hpA, SandboxIP: ipB, GuestPort: 8080})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), epA.Owner) || !strings.Contains(err.Error(), epB.Owner) {
		t.Fatalf("conflicting AddMapping: err = %v, want ErrConflict naming both owners", err)
	}
	if err := d.AddMapping(ctx, Mapping{Owner: epA.Owner, HostPort: cfg.PortMin + 5, SandboxIP: ipB, GuestPort: 8080}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("AddMapping to another sandbox's ip: err = %v, want ErrConflict", err)
	}
	if err := d.AddMapping(ctx, Mapping{Owner: epA.Owner, HostPort: cfg.PortMax + 1, SandboxIP: ipA, GuestPort: 1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("out-of-range AddMapping: err = %v, want ErrInvalidArgument", err)
	}

	// Reachable from the host: loopback, the host's own address, the transit address.
	mustTalk(t, "", fmt.Sprintf("127.0.0.1:%d", hpA), "A")
	mustTalk(t, "", d.DialAddr(hpA), "A")
	mustTalk(t, "", d.DialAddr(hpB), "B")
	if hostIP := firstGlobalHostIP(t); hostIP.IsValid() {
		mustTalk(t, "", netip.AddrPortFrom(hostIP, hpB).String(), "B")
	}
	mustNotTalk(t, "", d.DialAddr(cfg.PortMin+3)) // unmapped

	// Sandboxes cannot reach each other, directly or through a mapping.
	mustNotTalk(t, epA.NetNSPath, netip.AddrPortFrom(ipB, 8080).String())
	mustNotTalk(t, epA.NetNSPath, d.DialAddr(hpB))
	mustNotTalk(t, epB.NetNSPath, netip.AddrPortFrom(ipA, 8080).String())

	// A restarted agent reads mappings and owners back from the kernel.
	d.Close()
	d, err = Open(ctx, cfg)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	got, err := d.Mappings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != mA || got[1] != mB {
		t.Fatalf("Mappings after reopen = %+v, want [%+v %+v]", got, mA, mB)
	}
	eps, err := d.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 || eps[0] != epA || eps[1] != epB {
		t.Fatalf("Endpoints = %+v, want [%+v %+v]", eps, epA, epB)
	}
	mustTalk(t, "", d.DialAddr(hpA), "A") // still serving after reopen

	// Remapping the same port by the same owner replaces the target.
	if err := d.AddMapping(ctx, Mapping{Owner: epA.Owner, HostPort: hpA, SandboxIP: ipA, GuestPort: 9090}); err != nil {
		t.Fatal(err)
	}
	serveTag(t, epA.NetNSPath, "0.0.0.0:9090", "A9")
	mustTalk(t, "", d.DialAddr(hpA), "A9")
	if err := d.RemoveMapping(ctx, hpA); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveMapping(ctx, hpA); err != nil {
		t.Fatalf("RemoveMapping twice: %v", err)
	}
	mustNotTalk(t, "", d.DialAddr(hpA))
	if err := d.AddMapping(ctx, mA); err != nil {
		t.Fatal(err)
	}

	// Detach removes the link, pin, mappings and egress chain; twice is fine.
	if err := d.Detach(ctx, epA.Owner); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if err := d.Detach(ctx, epA.Owner); err != nil {
		t.Fatalf("Detach twice: %v", err)
	}
	if ok, _ := isPinned(epA.NetNSPath); ok {
		t.Errorf("pin %s still mounted", epA.NetNSPath)
	}
	if _, err := d.dp.LinkByName(epA.LinkName); err == nil {
		t.Errorf("link %s still present", epA.LinkName)
	}
	got, _ = d.Mappings(ctx)
	if len(got) != 1 || got[0] != mB {
		t.Errorf("Mappings after Detach = %+v, want [%+v]", got, mB)
	}
	if hasChain(t, d, chainName(epA.Owner)) {
		t.Errorf("chain %s still present", chainName(epA.Owner))
	}
	mustTalk(t, "", d.DialAddr(hpB), "B")
}

func TestOpenAndAttachRepairHalfPairs(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	ep, err := d.Attach(ctx, "sbx-repair", ip)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetEgress(ctx, ep.Owner, ip, EgressPolicy{}); err != nil {
		t.Fatal(err)
	}
	serveTag(t, ep.NetNSPath, "0.0.0.0:8080", "R")
	if err := d.AddMapping(ctx, Mapping{Owner: ep.Owner, HostPort: cfg.PortMin, SandboxIP: ip, GuestPort: 8080}); err != nil {
		t.Fatal(err)
	}

	// Crash leftovers: the host veth gone, the sandbox veth gone.
	if l, err := netlink.LinkByName(cfg.HostVeth); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := d.dp.LinkByName(ep.LinkName); err == nil {
		if err := d.dp.LinkDel(l); err != nil {
			t.Fatal(err)
		}
	}
	d.Close()
	d, err = Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open after losing %s: %v", cfg.HostVeth, err)
	}
	if _, err := d.Attach(ctx, ep.Owner, ip); err != nil {
		t.Fatalf("Attach repair: %v", err)
	}
	mustTalk(t, "", d.DialAddr(cfg.PortMin), "R")
	mustTalk(t, "", fmt.Sprintf("127.0.0.1:%d", cfg.PortMin), "R")

	// A foreign link with our HostVeth name is never taken over.
	d.Close()
	other := cfg
	other.DPName += "x"
	if _, err := Open(ctx, other); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Open with a foreign %s: err = %v, want ErrConflict", cfg.HostVeth, err)
	}
	// The failed Open pinned its own netns; remove it.
	_ = unpinNetNS(other.dpPin())
	if d, err = Open(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := d.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := d.Mappings(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("use after Destroy: err = %v, want ErrFailedPrecondition", err)
	}
}

func hostLinkNames(t *testing.T) map[string]bool {
	t.Helper()
	links, err := nldump.Retry(netlink.LinkList)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, l := range links {
		out[l.Attrs().Name] = true
	}
	return out
}

func firstGlobalHostIP(t *testing.T) netip.Addr {
	t.Helper()
	addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP.To4())
		if ip.IsGlobalUnicast() && !ip.IsLinkLocalUnicast() {
			return ip
		}
	}
	return netip.Addr{}
}

func hasChain(t *testing.T, d *Dataplane, name string) bool {
	t.Helper()
	c, err := d.dpConn()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == d.cfg.TablePrefix && ch.Name == name {
			return true
		}
	}
	return false
}

func TestIsHostRoute(t *testing.T) {
	ip := netip.MustParseAddr("10.222.0.7")
	cidr := func(s string) *net.IPNet { _, n, _ := net.ParseCIDR(s); return n }
	for _, tc := range []struct {
		name string
		r    netlink.Route
		want bool
	}{
		{"host route", netlink.Route{Dst: cidr("10.222.0.7/32"), Table: unix.RT_TABLE_MAIN}, true},
		{"host route, table unset", netlink.Route{Dst: cidr("10.222.0.7/32")}, true},
		{"covering prefix", netlink.Route{Dst: cidr("10.222.0.0/16"), Table: unix.RT_TABLE_MAIN}, false},
		{"default route", netlink.Route{Table: unix.RT_TABLE_MAIN}, false},
		{"other address", netlink.Route{Dst: cidr("10.222.0.8/32"), Table: unix.RT_TABLE_MAIN}, false},
		{"local table", netlink.Route{Dst: cidr("10.222.0.7/32"), Table: unix.RT_TABLE_LOCAL}, false},
	} {
		if got := isHostRoute(tc.r, ip); got != tc.want {
			t.Errorf("%s: isHostRoute = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Listings and attaches must not fail while links come and go in the
// dataplane (veths are deleted outside the dataplane lock, see Detach): the
// kernel interrupts a link or route dump that races a change, and such a
// dump is run again (nldump). Before, Endpoints and Attach failed with
// "results may be incomplete or inconsistent".
func TestDumpsSurviveLinkChurn(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	const n = 60
	ip := cfg.NodeCIDR.Addr().Next().Next()
	for i := range n {
		if _, err := d.Attach(ctx, fmt.Sprintf("sbx-dump-%d", i), ip); err != nil {
			t.Fatalf("Attach %d: %v", i, err)
		}
		ip = ip.Next()
	}
	h, err := netlink.NewHandleAt(d.dpNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	stop, churned := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				churned <- nil
				return
			default:
			}
			l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("churn%d", i%4)}, PeerName: fmt.Sprintf("churnp%d", i%4)}
			if err := h.LinkAdd(l); err != nil {
				churned <- err
				return
			}
			if err := h.LinkDel(l); err != nil {
				churned <- err
				return
			}
		}
	}()
	for i := range 300 {
		if _, err := d.Endpoints(ctx); err != nil {
			t.Errorf("Endpoints during link churn (round %d): %v", i, err)
			break
		}
		if _, err := d.Attach(ctx, "sbx-dump-0", cfg.NodeCIDR.Addr().Next().Next()); err != nil {
			t.Errorf("Attach during link churn (round %d): %v", i, err)
			break
		}
	}
	close(stop)
	if err := <-churned; err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := d.Detach(ctx, fmt.Sprintf("sbx-dump-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
}
