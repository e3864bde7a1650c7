package cubevs

import (
	"fmt"
	"net/netip"

	"github.com/cube-dev/cube/internal/errdefs"
)

// NextFreeIP returns the lowest usable IPv4 address of prefix that is not in
// taken. The network address, the first usable address (the gateway inside
// the dataplane netns) and the broadcast address are never returned. A full
// prefix yields an error wrapping errdefs.ErrResourceExhausted.
func NextFreeIP(prefix netip.Prefix, taken map[netip.Addr]bool) (netip.Addr, error) {
	if !prefix.IsValid() || !prefix.Addr().Is4() || prefix.Bits() > 30 {
		return netip.Addr{}, fmt.Errorf("allocate ip from %s: need an IPv4 prefix of /30 or larger: %w",
			prefix, errdefs.ErrInvalidArgument)
	}
	p := prefix.Masked()
	last := lastAddr(p)
	for ip := p.Addr().Next().Next(); ip.IsValid() && ip.Less(last); ip = ip.Next() {
		if !taken[ip] {
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("allocate ip from %s: all addresses taken: %w", p, errdefs.ErrResourceExhausted)
}

// NextFreePort returns the first port of [min, max] not in taken, scanning
// from start (clamped into the range) and wrapping around, so callers can
// rotate through the range instead of reusing a just-freed port. A full
// range yields an error wrapping errdefs.ErrResourceExhausted.
func NextFreePort(min, max uint16, taken map[uint16]bool, start uint16) (uint16, error) {
	if min == 0 || max < min {
		return 0, fmt.Errorf("allocate port: range %d-%d: %w", min, max, errdefs.ErrInvalidArgument)
	}
	if start < min || start > max {
		start = min
	}
	n := int(max) - int(min) + 1
	for i := 0; i < n; i++ {
		p := uint16(int(min) + (int(start)-int(min)+i)%n)
		if !taken[p] {
			return p, nil
		}
	}
	return 0, fmt.Errorf("allocate port: range %d-%d full: %w", min, max, errdefs.ErrResourceExhausted)
}

// lastAddr returns the broadcast address of an IPv4 prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	hostBits := 32 - p.Bits()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= uint32(uint64(1)<<hostBits - 1)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}
