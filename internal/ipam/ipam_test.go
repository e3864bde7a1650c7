package ipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestTakeIPSkipsNetworkGatewayBroadcast(t *testing.T) {
	a := New(netip.MustParsePrefix("10.9.0.0/29"), 20000, 20001) // usable: .2 .. .6
	var got []string
	for range 5 {
		ip, err := a.TakeIP()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ip.String())
	}
	if want := "10.9.0.2 10.9.0.3 10.9.0.4 10.9.0.5 10.9.0.6"; strings.Join(got, " ") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	_, err := a.TakeIP()
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("full CIDR: got %v, want ResourceExhausted", err)
	}
	for _, s := range []string{"10.9.0.0/29", "--node-cidr"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("exhaustion error %q does not name %q", err, s)
		}
	}
	// In a full CIDR a released address is the only free one.
	a.ReleaseIP(netip.MustParseAddr("10.9.0.4"))
	if ip, err := a.TakeIP(); err != nil || ip.String() != "10.9.0.4" {
		t.Fatalf("after release: %v %v, want 10.9.0.4", ip, err)
	}
}

// A released IP comes round again only after every other free one: the
// kernel destroys a killed sandbox's veth pair (and with it the route to its
// address) after the kill returns, so handing the address straight out
// again would meet that route.
func TestTakeIPNextFit(t *testing.T) {
	a := New(netip.MustParsePrefix("10.9.0.0/29"), 20000, 20001) // usable: .2 .. .6
	take := func() string {
		t.Helper()
		ip, err := a.TakeIP()
		if err != nil {
			t.Fatal(err)
		}
		return ip.String()
	}
	take() // .2
	take() // .3
	a.ReleaseIP(netip.MustParseAddr("10.9.0.2"))
	var got []string
	for range 3 {
		got = append(got, take())
	}
	// .4 .5 .6, then wrap to the freed .2 (.3 is still held).
	if want := "10.9.0.4 10.9.0.5 10.9.0.6"; strings.Join(got, " ") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	a.ReleaseIP(netip.MustParseAddr("10.9.0.5"))
	if ip := take(); ip != "10.9.0.2" {
		t.Fatalf("after the end: %s, want the freed 10.9.0.2 (wrapped)", ip)
	}
	if ip := take(); ip != "10.9.0.5" {
		t.Fatalf("next: %s, want 10.9.0.5", ip)
	}
	if _, err := a.TakeIP(); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("full: %v", err)
	}
	// Over a range wider than a bitmap word, the search crosses words.
	b := New(netip.MustParsePrefix("10.9.0.0/24"), 20000, 20001) // 253 usable
	for i := range 200 {
		if _, err := b.TakeIP(); err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
	}
	b.ReleaseIP(netip.MustParseAddr("10.9.0.10"))
	if ip, _ := b.TakeIP(); ip.String() != "10.9.0.202" {
		t.Fatalf("after 200 taken and .10 released: %s, want 10.9.0.202", ip)
	}
}

func TestHoldsAreCounted(t *testing.T) {
	a := New(netip.MustParsePrefix("10.9.0.0/24"), 20000, 20009)
	ip := netip.MustParseAddr("10.9.0.2")
	// A record and the create's reservation both hold ip and port 20000.
	a.Hold(ip, 20000)
	a.Hold(ip, 20000)
	a.Release(ip, 20000)
	if !a.IPHeld(ip) || !a.PortHeld(20000) {
		t.Fatal("one of two holds dropped freed the address")
	}
	if got, _ := a.TakeIP(); got == ip {
		t.Fatal("a held IP was handed out")
	}
	if p, _ := a.TakePort(nil); p == 20000 {
		t.Fatal("a held port was handed out")
	}
	a.Release(ip, 20000)
	a.Release(ip, 20000) // one release too many is ignored
	if a.IPHeld(ip) || a.PortHeld(20000) {
		t.Fatal("address still held after its last hold was dropped")
	}
	if ips, ports := a.Used(); ips != 1 || ports != 1 {
		t.Fatalf("used %d IPs, %d ports; want 1, 1 (the two taken above)", ips, ports)
	}
	a.Hold(ip, 20000)
	if ips, ports := a.Used(); ips != 2 || ports != 2 {
		t.Fatalf("a hold after over-release: used %d/%d, want 2/2", ips, ports)
	}
}

func TestOutOfRangeIgnored(t *testing.T) {
	a := New(netip.MustParsePrefix("10.9.0.0/24"), 20000, 20009)
	a.Hold(netip.MustParseAddr("10.8.0.5"), 19999, 30000, 0)
	a.Hold(netip.MustParseAddr("10.9.0.1"))   // the gateway
	a.Hold(netip.MustParseAddr("10.9.0.255")) // broadcast
	a.Hold(netip.Addr{})
	if ips, ports := a.Used(); ips != 0 || ports != 0 {
		t.Fatalf("out-of-range holds counted: %d IPs, %d ports", ips, ports)
	}
}

func TestTakePortSkipAndExhaustion(t *testing.T) {
	a := New(netip.MustParsePrefix("10.9.0.0/24"), 20000, 20129) // 130 ports: spans three words
	inKernel := map[uint16]bool{20000: true, 20064: true}
	seen := map[uint16]bool{}
	for range 128 {
		p, err := a.TakePort(func(p uint16) bool { return inKernel[p] })
		if err != nil {
			t.Fatal(err)
		}
		if inKernel[p] || seen[p] || p < 20000 || p > 20129 {
			t.Fatalf("port %d handed out twice, outside the range or mapped in the kernel", p)
		}
		seen[p] = true
	}
	_, err := a.TakePort(func(p uint16) bool { return inKernel[p] })
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "20000-20129") ||
		!strings.Contains(err.Error(), "--port-range") {
		t.Fatalf("exhaustion: %v", err)
	}
	// Without the skip the two remaining ports are free.
	for _, want := range []uint16{20000, 20064} {
		if p, err := a.TakePort(nil); err != nil || p != want {
			t.Fatalf("got %d %v, want %d", p, err, want)
		}
	}
	a.ReleasePort(20100)
	if p, err := a.TakePort(nil); err != nil || p != 20100 {
		t.Fatalf("after release: %d %v, want 20100", p, err)
	}
}

func TestRebuildFromHolds(t *testing.T) {
	// What a restart does: every record's address is held, then creates
	// take the free ones in between, from the start of the range.
	a := New(netip.MustParsePrefix("10.9.0.0/16"), 20000, 29999)
	for i := 2; i < 2002; i += 2 {
		a.Hold(netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), uint16(20000+i))
	}
	for i := 3; i < 2002; i += 2 {
		ip, err := a.TakeIP()
		if err != nil || ip != netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}) {
			t.Fatalf("take %d: %v %v", i, ip, err)
		}
	}
	if ip, _ := a.TakeIP(); ip.String() != "10.9.7.210" { // 2002 = 7*256+210
		t.Fatalf("next after the filled prefix: %v", ip)
	}
	if p, _ := a.TakePort(nil); p != 20000 {
		t.Fatalf("first free port: %d", p)
	}
	if p, _ := a.TakePort(nil); p != 20001 {
		t.Fatalf("second free port: %d", p)
	}
}

func TestInvalidRange(t *testing.T) {
	a := New(netip.Prefix{}, 0, 0)
	if _, err := a.TakeIP(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("TakeIP on no CIDR: %v", err)
	}
	if _, err := a.TakePort(nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("TakePort on no range: %v", err)
	}
	a.Hold(netip.MustParseAddr("10.0.0.2"), 5) // no panic
}

func BenchmarkTakeReleaseAt2000(b *testing.B) {
	a := New(netip.MustParsePrefix("172.16.0.0/18"), 20000, 29999)
	for range 2000 {
		a.TakeIP()
		a.TakePort(nil)
	}
	for b.Loop() {
		ip, _ := a.TakeIP()
		p, _ := a.TakePort(nil)
		a.Release(ip, p)
	}
}
