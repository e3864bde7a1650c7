package cubelet

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/nodestore"
)

// UpdateEgress replaces a running sandbox's egress policy, live.
func (c *Cubelet) UpdateEgress(ctx context.Context, id string, p cubevs.EgressPolicy) error {
	unlock := c.lock(id)
	defer unlock()
	rec, err := c.store.Get(id)
	if err != nil {
		return err
	}
	if err := c.dp.SetEgress(ctx, rec.Runtime(), rec.IP, p); err != nil {
		return fmt.Errorf("set egress: %w", err)
	}
	rec.AllowInternet = p.AllowInternet
	rec.AllowOut = prefixStrings(p.AllowOut)
	rec.DenyOut = prefixStrings(p.DenyOut)
	return c.putRecord(rec)
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// egressOf is the egress policy recorded for a sandbox.
func egressOf(r nodestore.Sandbox) cubevs.EgressPolicy {
	allow, _ := nodeproto.ParsePrefixes(r.AllowOut)
	deny, _ := nodeproto.ParsePrefixes(r.DenyOut)
	return cubevs.EgressPolicy{AllowInternet: r.AllowInternet, AllowOut: allow, DenyOut: deny}
}
