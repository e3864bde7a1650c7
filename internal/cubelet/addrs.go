package cubelet

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/ipam"
	"github.com/cube-dev/cube/internal/nodestore"
)

// Sandbox IPs and host ports come from in-memory free sets (c.addrs,
// package ipam), so a create costs the same with 0 or 2000 sandboxes on the
// node; before, each one listed every record under c.mu. An address is held
// while anything can still collide with it:
//
//   - an owner record names it: the node store tells the sets of every
//     committed record change (recordHolds), and they are rebuilt from the
//     records at every start. Records are written before the kernel object
//     and deleted after it, so a crash in between leaves the address held
//     by a record that Reconcile then tears down;
//   - a create picked it and has not written its record yet (a hold that
//     release drops once the record holds it, or the create failed);
//   - a kernel mapping has no owner record after a Reconcile (a sweep that
//     failed: strayPorts).

// recordHolds makes the free sets follow the owner records.
type recordHolds struct{ a *ipam.Allocator }

func (h recordHolds) Add(r nodestore.Sandbox)    { h.a.Hold(r.IP, hostPorts(r)...) }
func (h recordHolds) Remove(r nodestore.Sandbox) { h.a.Release(r.IP, hostPorts(r)...) }

func hostPorts(r nodestore.Sandbox) []uint16 {
	ps := make([]uint16, 0, len(r.Ports))
	for _, hp := range r.Ports {
		ps = append(ps, hp)
	}
	return ps
}

// newAddrs builds the free sets of cfg's ranges from store's records and
// keeps them in step with it.
func newAddrs(cfg cubevs.Config, store *nodestore.Store) *ipam.Allocator {
	a := ipam.New(cfg.NodeCIDR, cfg.PortMin, cfg.PortMax)
	if store != nil {
		store.Track(recordHolds{a})
	}
	return a
}

// allocate reserves a sandbox IP (a pool slot's, when given) and a host
// port for envd. The reservation is dropped by release once the owner
// record holds them (or create failed).
func (c *Cubelet) allocate(ctx context.Context, slot nodestore.Sandbox) (netip.Addr, uint16, func(), error) {
	skip, err := c.unreconciledPorts(ctx)
	if err != nil {
		return netip.Addr{}, 0, nil, err
	}
	ip := slot.IP
	if slot.ID == "" {
		if ip, err = c.addrs.TakeIP(); err != nil {
			return netip.Addr{}, 0, nil, fmt.Errorf("allocate sandbox IP: %w", err)
		}
	} else {
		c.addrs.Hold(ip)
	}
	port, err := c.addrs.TakePort(skip)
	if err != nil {
		c.addrs.ReleaseIP(ip)
		return netip.Addr{}, 0, nil, fmt.Errorf("allocate host port: %w", err)
	}
	return ip, port, func() { c.addrs.Release(ip, port) }, nil
}

// takePort reserves a free host port; release it once a record holds it.
func (c *Cubelet) takePort(ctx context.Context) (uint16, error) {
	skip, err := c.unreconciledPorts(ctx)
	if err != nil {
		return 0, err
	}
	return c.addrs.TakePort(skip)
}

// unreconciledPorts returns nil after a Reconcile: every kernel mapping's
// port is then held by a record or a reservation (the cubelet records a
// port before mapping it and forgets it only after unmapping it), or is a
// stray port it holds. Before one (or after one that could not read the
// kernel), the kernel's mappings are read, outside any lock: a mapping
// made after the read has its port held by a record or a reservation.
func (c *Cubelet) unreconciledPorts(ctx context.Context) (func(uint16) bool, error) {
	c.mu.Lock()
	reconciled := c.reconciled
	c.mu.Unlock()
	if reconciled {
		return nil, nil
	}
	maps, err := c.dp.Mappings(ctx)
	if err != nil {
		return nil, fmt.Errorf("read mappings: %w", err)
	}
	mapped := make(map[uint16]bool, len(maps))
	for _, m := range maps {
		mapped[m.HostPort] = true
	}
	return func(p uint16) bool { return mapped[p] }, nil
}

// holdStrayPorts replaces the held stray ports (mapped in the kernel
// without an owner record) with ports. Callers hold c.mu.
func (c *Cubelet) holdStrayPorts(ports map[uint16]bool) {
	for p := range c.strayPorts {
		c.addrs.ReleasePort(p)
	}
	for p := range ports {
		c.addrs.Hold(netip.Addr{}, p)
	}
	c.strayPorts = ports
}
