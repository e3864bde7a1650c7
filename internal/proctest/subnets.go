package proctest

import (
	mrand "math/rand/v2"
	"net/netip"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
)

var (
	octetsMu   sync.Mutex
	octetsUsed = map[int]bool{}
)

// FreeOctet picks at random a number in [lo, hi] for a test node's subnets:
// one this process has not handed out, and whose subnets (subnets(octet))
// no IPv4 route of the host overlaps. A route there belongs to another
// dataplane: a concurrent test binary's, or one a killed run left behind,
// and a cubelet refuses a transit subnet the host already routes.
func FreeOctet(t testing.TB, lo, hi int, subnets func(octet int) []netip.Prefix) int {
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
		a, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if ones, _ := r.Dst.Mask.Size(); ok && ones > 0 {
			routed = append(routed, netip.PrefixFrom(a, ones))
		}
	}
	octetsMu.Lock()
	defer octetsMu.Unlock()
	var free []int
	for o := lo; o <= hi; o++ {
		if !octetsUsed[o] && !overlapsAny(subnets(o), routed) {
			free = append(free, o)
		}
	}
	if len(free) == 0 {
		t.Fatalf("no free test node subnets for octets %d-%d: host routes or this process cover them all", lo, hi)
	}
	o := free[mrand.IntN(len(free))]
	octetsUsed[o] = true
	return o
}

func overlapsAny(subnets, routed []netip.Prefix) bool {
	for _, s := range subnets {
		for _, r := range routed {
			if r.Overlaps(s) {
				return true
			}
		}
	}
	return false
}
