package cubelet

import (
	"context"
	"net"
)

// DialContext connects to an address returned by SandboxAddr. It dials from
// the host network namespace the dataplane is attached to, so a proxy in the
// same process reaches sandboxes even when the cubelet runs in a Pod's own
// network namespace (hostNetwork: false).
func (c *Cubelet) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return c.dp.DialContext(ctx, network, addr)
}
