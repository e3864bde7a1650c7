package cubevs

import (
	"net"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cube-dev/cube/internal/nldump"
)

// Attach again (a repair) removes routes that do not belong on the
// sandbox's link and keeps its own /32. A first Attach makes the link and
// has nothing to clean: it does not list the namespace's routes.
func TestAttachRepairRemovesStrayRoutes(t *testing.T) {
	d, ep, link := attachOne(t, "sbx-route")
	ctx := ctxT(t)
	ip := ep.IP
	stray := ip.Next()
	dsts := func() []string {
		routes, err := nldump.Retry(func() ([]netlink.Route, error) { return d.dp.RouteList(link, netlink.FAMILY_V4) })
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range routes {
			out = append(out, r.Dst.String())
		}
		slices.Sort(out)
		return out
	}
	if got, want := dsts(), []string{ip.String() + "/32"}; !slices.Equal(got, want) {
		t.Fatalf("routes on a new link: %v, want %v", got, want)
	}
	if err := d.dp.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: stray.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Attach(ctx, ep.Owner, ip); err != nil {
		t.Fatalf("Attach again: %v", err)
	}
	if got, want := dsts(), []string{ip.String() + "/32"}; !slices.Equal(got, want) {
		t.Fatalf("routes after the repair: %v, want %v", got, want)
	}
}

// The dataplane namespace has IPv6 off, so a sandbox's link there gets no
// IPv6 address (nor routes), while the sandbox keeps ::1 on its loopback.
func TestDataplaneLinksHaveNoIPv6(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("no IPv6 in this kernel")
	}
	d, ep, link := attachOne(t, "sbx-v6")
	if addrs, err := d.dp.AddrList(link, netlink.FAMILY_V6); err != nil || len(addrs) != 0 {
		t.Errorf("IPv6 addresses on the dataplane link: %v %v", addrs, err)
	}
	sbNS, err := netns.GetFromPath(ep.NetNSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sbNS.Close()
	sb, err := netlink.NewHandleAt(sbNS)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	lo, err := sb.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := sb.AddrList(lo, netlink.FAMILY_V6)
	if err != nil || !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(net.IPv6loopback) }) {
		t.Errorf("sandbox loopback lost ::1: %v %v", addrs, err)
	}
}

// attachOne opens a test dataplane and attaches owner at the node CIDR's
// second address; it returns the dataplane, the endpoint and its link in
// the dataplane namespace. The attachment is detached at the end.
func attachOne(t *testing.T, owner string) (*Dataplane, Endpoint, netlink.Link) {
	t.Helper()
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ep, err := d.Attach(ctx, owner, cfg.NodeCIDR.Addr().Next().Next())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Detach(ctx, ep.Owner) })
	link, err := d.dp.LinkByName(ep.LinkName)
	if err != nil {
		t.Fatal(err)
	}
	return d, ep, link
}
