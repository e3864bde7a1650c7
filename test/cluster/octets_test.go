package cluster_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cube-dev/cube/internal/proctest"
)

// maxOctet bounds the octets handed out: a node's host ports start at
// 30000+octet*20 and must stay below the kernel's ephemeral ports.
const maxOctet = 120

// nodeSubnets are the transit and sandbox subnets of the node at octet
// (172.26/16 is this package's alone: test/integration, which runs beside
// it, uses 172.29).
func nodeSubnets(octet int) (transit, nodeCIDR netip.Prefix) {
	return netip.MustParsePrefix(fmt.Sprintf("10.253.%d.0/30", octet)),
		netip.MustParsePrefix(fmt.Sprintf("172.26.%d.0/24", octet))
}

// freeOctet picks the third octet of a new node's subnets: none another
// node of this run or another dataplane on the host uses.
func freeOctet(t *testing.T) int {
	return proctest.FreeOctet(t, 1, maxOctet, func(o int) []netip.Prefix {
		transit, cidr := nodeSubnets(o)
		return []netip.Prefix{transit, cidr}
	})
}
