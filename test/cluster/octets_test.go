package cluster_test

import (
	"fmt"
	mrand "math/rand/v2"
	"net/netip"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
)

// maxOctet bounds the octets handed out: a node's host ports start at
// 30000+octet*20 and must stay below the kernel's ephemeral ports.
const maxOctet = 120

var (
	octetsMu   sync.Mutex
	octetsUsed = map[int]bool{}
)

// nodeSubnets are the transit and sandbox subnets of the node at octet.
func nodeSubnets(octet int) (transit, nodeCIDR netip.Prefix) {
	return netip.MustParsePrefix(fmt.Sprintf("10.253.%d.0/30", octet)),
		netip.MustParsePrefix(fmt.Sprintf("172.29.%d.0/24", octet))
}

// freeOctet picks, at random, the third octet of a new node's subnets: one
// this process has not handed out and whose subnets no host route overlaps.
// A route there is another run's node (a concurrent `go test`, or one a
// killed run left behind); the cubelet would refuse its transit subnet.
func freeOctet(t *testing.T) int {
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatalf("list host routes: %v", err)
	}
	var routed []netip.Prefix
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok {
			ones, _ := r.Dst.Mask.Size()
			routed = append(routed, netip.PrefixFrom(a, ones))
		}
	}
	octetsMu.Lock()
	defer octetsMu.Unlock()
	var free []int
	for o := 1; o <= maxOctet; o++ {
		if !octetsUsed[o] && !overlapsAny(o, routed) {
			free = append(free, o)
		}
	}
	if len(free) == 0 {
		t.Fatalf("no free node subnet among 10.253.1-%d.0/30: host routes cover them all", maxOctet)
	}
	o := free[mrand.IntN(len(free))]
	octetsUsed[o] = true
	return o
}

func overlapsAny(octet int, routed []netip.Prefix) bool {
	transit, cidr := nodeSubnets(octet)
	for _, p := range routed {
		if p.Bits() > 0 && (p.Overlaps(transit) || p.Overlaps(cidr)) {
			return true
		}
	}
	return false
}
