package proctest

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestFreeOctetSkipsRoutedSubnets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: adds a veth with a route")
	}
	// A veth routes 10.249.<busy>.0/24, as a leftover dataplane's would.
	busy := 100 + int(RandHex(1)[0])%50
	tag := RandHex(3)
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pt" + tag}, PeerName: "pp" + tag}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(link) })
	addr, _ := netlink.ParseAddr(fmt.Sprintf("10.249.%d.1/24", busy))
	if err := netlink.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	subnets := func(o int) []netip.Prefix {
		return []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.249.%d.0/30", o))}
	}
	for range 5 {
		octetsMu.Lock()
		delete(octetsUsed, busy+1)
		octetsMu.Unlock()
		if got := FreeOctet(t, busy, busy+1, subnets); got != busy+1 {
			t.Fatalf("FreeOctet = %d, want %d (10.249.%d.0/24 is routed)", got, busy+1, busy)
		}
	}
	// Handed out once, an octet is not handed out again by this process.
	if got := FreeOctet(t, busy+1, busy+2, subnets); got != busy+2 {
		t.Fatalf("FreeOctet = %d, want %d (%d was handed out)", got, busy+2, busy+1)
	}
}
