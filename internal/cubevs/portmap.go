package cubevs

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"

	"github.com/google/nftables"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Mapping forwards HostPort (TCP and UDP, on every host address and on
// DialAddr) to SandboxIP:GuestPort. Owner is stored with the kernel element
// (its nft comment) and read back by Mappings.
type Mapping struct {
	Owner     string
	HostPort  uint16
	SandboxIP netip.Addr
	GuestPort uint16
}

// AddMapping installs m in the dataplane port map. If HostPort is already
// mapped: same owner and target is a no-op, same owner with another target
// replaces it, another owner is an error wrapping errdefs.ErrConflict that
// names both owners.
func (d *Dataplane) AddMapping(ctx context.Context, m Mapping) (err error) {
	if err := d.cfg.validOwner(m.Owner); err != nil {
		return err
	}
	if err := d.cfg.validSandboxIP(m.SandboxIP); err != nil {
		return err
	}
	if m.HostPort < d.cfg.PortMin || m.HostPort > d.cfg.PortMax || m.GuestPort == 0 {
		return fmt.Errorf("map host port %d -> %s:%d: host port must be in %d-%d, guest port non-zero: %w",
			m.HostPort, m.SandboxIP, m.GuestPort, d.cfg.PortMin, d.cfg.PortMax, errdefs.ErrInvalidArgument)
	}
	unlock, err := d.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if _, other, err := d.routeOwner(m.SandboxIP); err != nil {
		return err
	} else if other != "" && other != m.Owner {
		return fmt.Errorf("map host port %d for %q: %s is attached to %q: %w",
			m.HostPort, m.Owner, m.SandboxIP, other, errdefs.ErrConflict)
	}
	c, err := d.dpConn()
	if err != nil {
		return err
	}
	defer d.settleNFT(&err)
	ports, err := d.portsOf(c)
	if err != nil {
		return err
	}
	set := d.portmapSet()
	if old, ok := ports[m.HostPort]; ok {
		if old.Owner != m.Owner {
			return fmt.Errorf("host port %d is mapped to %s:%d owned by %q; %q cannot take it: %w",
				m.HostPort, old.SandboxIP, old.GuestPort, old.Owner, m.Owner, errdefs.ErrConflict)
		}
		if old == m {
			return nil
		}
		if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: portKey(old.HostPort)}}); err != nil {
			return fmt.Errorf("replace mapping %d: %w", m.HostPort, err)
		}
	}
	if err := c.SetAddElements(set, []nftables.SetElement{encodeMapping(m)}); err != nil {
		return fmt.Errorf("add mapping %d: %w", m.HostPort, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("add mapping %d -> %s:%d: %w", m.HostPort, m.SandboxIP, m.GuestPort, err)
	}
	ports[m.HostPort] = m
	return nil
}

// portsOf returns the mirror of the port map set, reading the set once
// when there is none. Every change this process makes to the set goes
// through the dataplane's lock and updates the mirror once it is
// committed; a failed operation drops the mirror with the connection
// (dropNFT), and Mappings refreshes it from the kernel. So a create checks
// its port against memory instead of dumping the whole set under the lock
// (which grew with every sandbox on the node). The set lives in Cube's own
// network namespace: nothing else is meant to write it.
func (d *Dataplane) portsOf(c *nftables.Conn) (map[uint16]Mapping, error) {
	if d.ports != nil {
		return d.ports, nil
	}
	elems, err := c.GetSetElements(d.portmapSet())
	if err != nil {
		return nil, fmt.Errorf("read port map: %w", err)
	}
	d.ports = mirrorOf(elems)
	return d.ports, nil
}

func mirrorOf(elems []nftables.SetElement) map[uint16]Mapping {
	ports := make(map[uint16]Mapping, len(elems))
	for _, e := range elems {
		if m, ok := decodeMapping(e); ok {
			ports[m.HostPort] = m
		}
	}
	return ports
}

// RemoveMapping deletes the mapping of hostPort; an unmapped port is fine.
func (d *Dataplane) RemoveMapping(ctx context.Context, hostPort uint16) error {
	unlock, err := d.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return d.deleteMappings(func(m Mapping) bool { return m.HostPort == hostPort })
}

// Mappings reads the port map back from the kernel, sorted by host port.
func (d *Dataplane) Mappings(ctx context.Context) (_ []Mapping, err error) {
	unlock, err := d.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	c, err := d.dpConn()
	if err != nil {
		return nil, err
	}
	defer d.settleNFT(&err)
	elems, err := c.GetSetElements(d.portmapSet())
	if err != nil {
		return nil, fmt.Errorf("read port map: %w", err)
	}
	d.ports = mirrorOf(elems)
	out := make([]Mapping, 0, len(d.ports))
	for _, m := range d.ports {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].HostPort < out[j].HostPort })
	return out, nil
}

// deleteMappings removes, in one transaction, the elements matching del.
func (d *Dataplane) deleteMappings(del func(Mapping) bool) (err error) {
	c, err := d.dpConn()
	if err != nil {
		return err
	}
	defer d.settleNFT(&err)
	ports, err := d.portsOf(c)
	if err != nil {
		return err
	}
	deleted, err := d.queueUnmap(c, ports, del)
	if err != nil || len(deleted) == 0 {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete mappings: %w", err)
	}
	forget(ports, deleted)
	return nil
}

// queueUnmap queues, on c, the deletion of the mappings in ports (the
// mirror) that match del, and returns their host ports. Once the caller's
// transaction is committed it drops them from the mirror with forget.
func (d *Dataplane) queueUnmap(c *nftables.Conn, ports map[uint16]Mapping, del func(Mapping) bool) ([]uint16, error) {
	var gone []nftables.SetElement
	var hostPorts []uint16
	for hp, m := range ports {
		if del(m) {
			gone = append(gone, nftables.SetElement{Key: portKey(hp)})
			hostPorts = append(hostPorts, hp)
		}
	}
	if len(gone) == 0 {
		return nil, nil
	}
	if err := c.SetDeleteElements(d.portmapSet(), gone); err != nil {
		return nil, fmt.Errorf("delete from %s: %w", d.portmapSet().Name, err)
	}
	return hostPorts, nil
}

// forget drops committed deletions from the port mirror.
func forget(ports map[uint16]Mapping, hostPorts []uint16) {
	for _, hp := range hostPorts {
		delete(ports, hp)
	}
}

// encodeMapping lays out key = port (2 bytes), value = ip (4) . port (2,
// padded to a 4-byte register), comment = owner.
func encodeMapping(m Mapping) nftables.SetElement {
	key := portKey(m.HostPort)
	ip := m.SandboxIP.As4()
	val := make([]byte, 8)
	copy(val, ip[:])
	binary.BigEndian.PutUint16(val[4:], m.GuestPort)
	return nftables.SetElement{Key: key, Val: val, Comment: m.Owner}
}

// portKey is the port map's key for hostPort.
func portKey(hostPort uint16) []byte {
	return binary.BigEndian.AppendUint16(nil, hostPort)
}

func decodeMapping(e nftables.SetElement) (Mapping, bool) {
	if len(e.Key) < 2 || len(e.Val) < 6 {
		return Mapping{}, false
	}
	return Mapping{
		Owner:     e.Comment,
		HostPort:  binary.BigEndian.Uint16(e.Key),
		SandboxIP: netip.AddrFrom4([4]byte(e.Val[:4])),
		GuestPort: binary.BigEndian.Uint16(e.Val[4:6]),
	}, true
}
