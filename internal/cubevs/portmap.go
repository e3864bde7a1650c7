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
	return d.retryStale(func(c *nftables.Conn, mi *nftMirror) error { return d.addMapping(c, mi, m) })
}

// addMapping checks m against the mirror, then maps it in one transaction.
func (d *Dataplane) addMapping(c *nftables.Conn, mi *nftMirror, m Mapping) error {
	set := d.portmapSet()
	if old, ok := mi.ports[m.HostPort]; ok {
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
	if err := flush(c, "add mapping %d -> %s:%d", m.HostPort, m.SandboxIP, m.GuestPort); err != nil {
		return err
	}
	mi.putPort(m)
	return nil
}

// RemoveMapping deletes the mapping of hostPort; an unmapped port is fine.
// It looks the port up in the mirror: no read of the kernel's port map.
func (d *Dataplane) RemoveMapping(ctx context.Context, hostPort uint16) error {
	unlock, err := d.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return d.retryStale(func(c *nftables.Conn, mi *nftMirror) error {
		if _, ok := mi.ports[hostPort]; !ok {
			return nil
		}
		if err := d.queueUnmap(c, []uint16{hostPort}); err != nil {
			return err
		}
		if err := flush(c, "delete mapping %d", hostPort); err != nil {
			return err
		}
		mi.forgetPort(hostPort)
		return nil
	})
}

// Mappings reads the port map back from the kernel, sorted by host port,
// and refreshes the mirror's port part with it.
func (d *Dataplane) Mappings(ctx context.Context) (_ []Mapping, err error) {
	unlock, err := d.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []Mapping
	fresh := d.nftm == nil // then mirror reads the kernel now
	err = d.tryOnce(func(c *nftables.Conn, mi *nftMirror) error {
		if !fresh {
			elems, err := c.GetSetElements(d.portmapSet())
			if err != nil {
				return fmt.Errorf("read port map: %w", err)
			}
			mi.setPorts(elems)
		}
		out = make([]Mapping, 0, len(mi.ports))
		for _, m := range mi.ports {
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].HostPort < out[j].HostPort })
	return out, nil
}

// queueUnmap queues, on c, the deletion of the mappings of hostPorts (all
// in the mirror). Once the caller's transaction is committed it drops them
// from the mirror.
func (d *Dataplane) queueUnmap(c *nftables.Conn, hostPorts []uint16) error {
	if len(hostPorts) == 0 {
		return nil
	}
	gone := make([]nftables.SetElement, 0, len(hostPorts))
	for _, hp := range hostPorts {
		gone = append(gone, nftables.SetElement{Key: portKey(hp)})
	}
	if err := c.SetDeleteElements(d.portmapSet(), gone); err != nil {
		return fmt.Errorf("delete from %s: %w", d.portmapSet().Name, err)
	}
	return nil
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
