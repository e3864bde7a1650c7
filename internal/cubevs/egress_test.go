package cubevs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cube-dev/cube/internal/errdefs"
)

// upstream is a test-made netns joined to the host by a veth, standing in
// for the internet (198.18.x.2, benchmark range) and a private network
// (10.254.x.2). The host side holds .1 of each /30.
type upstream struct {
	nsPath          string
	pub, priv       netip.Addr
	hostPub         netip.Addr
	pubNet, privNet netip.Prefix
}

func newUpstream(t *testing.T) upstream {
	t.Helper()
	r := randU32(t)
	path := t.TempDir() + "/upstream"
	if err := pinNewNetNS(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unpinNetNS(path) })
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	name := fmt.Sprintf("cvu%06x", r&0xffffff)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(h)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	x, y := byte(r>>8), byte(r>>16)&^3
	u := upstream{
		nsPath:  path,
		pubNet:  netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, x, y}), 30),
		privNet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 254, x, y}), 30),
	}
	u.hostPub = u.pubNet.Addr().Next()
	u.pub = u.hostPub.Next()
	u.priv = u.privNet.Addr().Next().Next()
	hl, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*netlink.Addr{addr(u.hostPub, 30), addr(u.privNet.Addr().Next(), 30)} {
		if err := netlink.AddrAdd(hl, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		t.Fatal(err)
	}
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	for _, n := range []string{"lo", "eth0"} {
		l, err := nh.LinkByName(n)
		if err != nil {
			t.Fatal(err)
		}
		if n == "eth0" {
			for _, a := range []*netlink.Addr{addr(u.pub, 30), addr(u.priv, 30)} {
				if err := nh.AddrAdd(l, a); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := nh.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	serveTag(t, path, "0.0.0.0:80", "up")
	return u
}

func mustBeRejected(t *testing.T, nsPath, addr string) {
	t.Helper()
	_, err := talk(t, nsPath, addr, 2*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("talk %s from sandbox: err = %v, want ECONNREFUSED (reset by policy)", addr, err)
	}
}

// dialFromSpoofed gives the sandbox at nsPath the address src too (one it
// was not given) and dials dst from it.
func dialFromSpoofed(t *testing.T, nsPath string, src netip.Addr, dst string) error {
	t.Helper()
	if err := inNS(t, nsPath, func() error {
		l, err := netlink.LinkByName(sandboxIfName)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, addr(src, 32))
	}); err != nil {
		t.Fatal(err)
	}
	return inNS(t, nsPath, func() error {
		dl := net.Dialer{Timeout: 700 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		c, err := dl.Dial("tcp4", dst)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func TestEgressPolicy(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	up := newUpstream(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	ep, err := d.Attach(ctx, "sbx-egress", ip)
	if err != nil {
		t.Fatal(err)
	}
	sb := ep.NetNSPath
	pub := netip.AddrPortFrom(up.pub, 80).String()
	priv := netip.AddrPortFrom(up.priv, 80).String()
	set := func(p EgressPolicy) {
		t.Helper()
		if err := d.SetEgress(ctx, ep.Owner, ip, p); err != nil {
			t.Fatalf("SetEgress %+v: %v", p, err)
		}
	}

	// Before any policy: nothing leaves.
	mustNotTalk(t, sb, pub)

	set(EgressPolicy{AllowInternet: false})
	mustBeRejected(t, sb, pub)
	mustBeRejected(t, sb, priv)

	// Inbound mappings work whatever the egress policy.
	serveTag(t, sb, "0.0.0.0:8080", "S")
	if err := d.AddMapping(ctx, Mapping{Owner: ep.Owner, HostPort: cfg.PortMin, SandboxIP: ip, GuestPort: 8080}); err != nil {
		t.Fatal(err)
	}
	mustTalk(t, "", d.DialAddr(cfg.PortMin), "S")
	// From another "host" (the upstream netns) through this host's address.
	mustTalk(t, up.nsPath, netip.AddrPortFrom(up.hostPub, cfg.PortMin).String(), "S")

	set(EgressPolicy{AllowInternet: true}) // live update
	mustTalk(t, sb, pub, "up")
	mustBeRejected(t, sb, priv)
	hostLn := serveTag(t, "", netip.AddrPortFrom(up.hostPub, 0).String(), "host")
	mustBeRejected(t, sb, hostLn.String())
	transitLn := serveTag(t, "", netip.AddrPortFrom(cfg.transitHost(), 0).String(), "host")
	mustBeRejected(t, sb, transitLn.String())
	mustBeRejected(t, sb, "169.254.169.254:80")
	mustBeRejected(t, sb, netip.AddrPortFrom(cfg.gateway(), 80).String())

	set(EgressPolicy{AllowInternet: true, AllowOut: []netip.Prefix{up.privNet}})
	mustTalk(t, sb, priv, "up")
	// Even an explicit allow cannot open the always-denied ranges.
	set(EgressPolicy{AllowInternet: true, AllowOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}})
	mustBeRejected(t, sb, hostLn.String())
	mustBeRejected(t, sb, "169.254.169.254:80")

	set(EgressPolicy{AllowInternet: true, DenyOut: []netip.Prefix{up.pubNet}})
	mustBeRejected(t, sb, pub)
	set(EgressPolicy{AllowInternet: true, AllowOut: []netip.Prefix{up.pubNet}, DenyOut: []netip.Prefix{up.pubNet}})
	mustTalk(t, sb, pub, "up") // allow wins over deny

	set(EgressPolicy{AllowInternet: false, AllowOut: []netip.Prefix{netip.PrefixFrom(up.pub, 32)}})
	mustTalk(t, sb, pub, "up")
	mustBeRejected(t, sb, priv)

	// A sandbox cannot use an address it was not given.
	set(EgressPolicy{AllowInternet: true})
	if err := dialFromSpoofed(t, sb, ip.Next().Next(), pub); err == nil {
		t.Fatal("dial from a spoofed source address succeeded")
	}

	bad := EgressPolicy{AllowOut: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}
	if err := d.SetEgress(ctx, ep.Owner, ip, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("IPv6 prefix: err = %v, want ErrInvalidArgument", err)
	}
	if err := d.Detach(ctx, ep.Owner); err != nil {
		t.Fatal(err)
	}
	if hasChain(t, d, chainName(ep.Owner)) {
		t.Fatal("egress chain left after Detach")
	}
}
