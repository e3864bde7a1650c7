// Package ipam hands out a node's sandbox IPs (from the node CIDR) and host
// ports (from the port range) from in-memory free sets.
//
// Before, every create built the set of taken addresses from every owner
// record and scanned the range from its start under the cubelet's
// allocation lock: the cost of a create grew with the sandboxes already on
// the node. Here an address is a bit in a bitmap plus a hold count, so
// taking and giving back one costs the same with 0 or 2000 sandboxes.
//
// An address is held by whoever can still collide with it: an owner record
// (the cubelet's node store reports every committed record change, see
// nodestore.Store.Track), a create that picked it and has not written its
// record yet, or a kernel mapping nobody owns. Holds are counted, so two
// holders (a record and the reservation that preceded it, or a stale and a
// live record naming the same port) never free an address early. The sets
// live only in memory: they are rebuilt from the records at every start.
package ipam

import (
	"fmt"
	"math/bits"
	"net/netip"
	"sync"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Allocator holds the free sets of one node. It is safe for concurrent use.
type Allocator struct {
	mu    sync.Mutex
	ips   span
	ports span
	cidr  netip.Prefix
	pmin  uint16
}

// New returns an allocator over the usable addresses of cidr (the network
// address, the gateway (the first address) and the broadcast address are
// never handed out, as before) and the ports min..max. An invalid range is
// not an error here: taking from it is (InvalidArgument), so offline tools
// built without a network config still work.
func New(cidr netip.Prefix, min, max uint16) *Allocator {
	a := &Allocator{cidr: cidr.Masked(), pmin: min}
	if cidr.IsValid() && cidr.Addr().Is4() && cidr.Bits() <= 30 {
		size := uint32(1) << (32 - cidr.Bits())
		a.ips = newSpan(int(size-3), fmt.Sprintf("sandbox IPs of %s", a.cidr), "--node-cidr")
		a.ips.rotate = true
	} else {
		a.ips = span{name: fmt.Sprintf("sandbox IPs of %s", cidr), flag: "--node-cidr",
			invalid: "need an IPv4 prefix of /30 or larger"}
	}
	if min != 0 && max >= min {
		a.ports = newSpan(int(max)-int(min)+1, fmt.Sprintf("host ports %d-%d", min, max), "--port-range")
	} else {
		a.ports = span{name: fmt.Sprintf("host ports %d-%d", min, max), flag: "--port-range", invalid: "empty range"}
	}
	return a
}

// ipIndex is ip's position among the usable addresses, or -1 outside them.
func (a *Allocator) ipIndex(ip netip.Addr) int {
	if !ip.Is4() || !a.cidr.Contains(ip) || a.ips.n == 0 {
		return -1
	}
	base := a.cidr.Addr().As4()
	v := ip.As4()
	i := int(be32(v)-be32(base)) - 2
	if i < 0 || i >= a.ips.n {
		return -1
	}
	return i
}

func (a *Allocator) ipAt(i int) netip.Addr {
	v := be32(a.cidr.Addr().As4()) + uint32(i) + 2
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (a *Allocator) portIndex(p uint16) int {
	i := int(p) - int(a.pmin)
	if p == 0 || i < 0 || i >= a.ports.n {
		return -1
	}
	return i
}

func be32(b [4]byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// TakeIP holds and returns the next free IP after the last one it handed
// out, wrapping at the end of the CIDR (next fit, not lowest free): a
// killed sandbox's address is handed out again only after every other free
// one, so the kernel has long finished destroying its old veth pair (which
// it does after the kill returns, see cubevs.Dataplane.Detach) when the
// address comes round again. Give it back with ReleaseIP.
// A full CIDR yields an error wrapping errdefs.ErrResourceExhausted that
// names the range and the flag that widens it.
func (a *Allocator) TakeIP() (netip.Addr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, err := a.ips.take(nil)
	if err != nil {
		return netip.Addr{}, err
	}
	return a.ipAt(i), nil
}

// TakePort holds and returns the lowest free port for which skip (may be
// nil) is false: skip excludes ports the caller knows to be in use
// elsewhere (the kernel's mappings, read before a reconcile). Give it back
// with ReleasePort.
func (a *Allocator) TakePort(skip func(uint16) bool) (uint16, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var skipIdx func(int) bool
	if skip != nil {
		skipIdx = func(i int) bool { return skip(uint16(int(a.pmin) + i)) }
	}
	i, err := a.ports.take(skipIdx)
	if err != nil {
		return 0, err
	}
	return uint16(int(a.pmin) + i), nil
}

// Hold adds one hold on ip (when valid) and on each port. Addresses
// outside the ranges are ignored: they cannot collide with what is handed
// out (a record written under an earlier --node-cidr or --port-range).
func (a *Allocator) Hold(ip netip.Addr, ports ...uint16) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i := a.ipIndex(ip); i >= 0 {
		a.ips.hold(i)
	}
	for _, p := range ports {
		if i := a.portIndex(p); i >= 0 {
			a.ports.hold(i)
		}
	}
}

// Release drops one hold on ip (when valid) and on each port; an address
// is free again when its last hold is dropped.
func (a *Allocator) Release(ip netip.Addr, ports ...uint16) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if i := a.ipIndex(ip); i >= 0 {
		a.ips.release(i)
	}
	for _, p := range ports {
		if i := a.portIndex(p); i >= 0 {
			a.ports.release(i)
		}
	}
}

// ReleaseIP drops one hold on ip.
func (a *Allocator) ReleaseIP(ip netip.Addr) { a.Release(ip) }

// ReleasePort drops one hold on port p.
func (a *Allocator) ReleasePort(p uint16) { a.Release(netip.Addr{}, p) }

// Used returns how many IPs and ports are held.
func (a *Allocator) Used() (ips, ports int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ips.used, a.ports.used
}

// IPHeld and PortHeld report whether an address has a hold.
func (a *Allocator) IPHeld(ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := a.ipIndex(ip)
	return i >= 0 && a.ips.count[i] > 0
}

func (a *Allocator) PortHeld(p uint16) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	i := a.portIndex(p)
	return i >= 0 && a.ports.count[i] > 0
}

// span is a free set over the indices 0..n-1: a bitmap of held indices
// (for a word-at-a-time search) and the hold count of each.
type span struct {
	n     int
	full  []uint64 // bit set: index held
	count map[int]uint32
	used  int
	// low: every index below it is held (the search starts there).
	low int
	// rotate: take hands out the first free index at or after next,
	// wrapping, instead of the lowest free one.
	rotate  bool
	next    int
	name    string // in errors: "sandbox IPs of 172.16.0.0/18"
	flag    string // the flag that widens the range
	invalid string // why the range is unusable ("" when it is usable)
}

func newSpan(n int, name, flag string) span {
	return span{n: n, full: make([]uint64, (n+63)/64), count: map[int]uint32{}, name: name, flag: flag}
}

func (s *span) hold(i int) {
	s.count[i]++
	if s.count[i] == 1 {
		s.full[i/64] |= 1 << (i % 64)
		s.used++
	}
}

func (s *span) release(i int) {
	c, ok := s.count[i]
	if !ok {
		return // not held: a release without a hold is ignored, never underflows
	}
	if c > 1 {
		s.count[i] = c - 1
		return
	}
	delete(s.count, i)
	s.full[i/64] &^= 1 << (i % 64)
	s.used--
	if i < s.low {
		s.low = i
	}
}

// take holds the lowest free index for which skip is false (with rotate:
// the first free one at or after next, wrapping).
func (s *span) take(skip func(int) bool) (int, error) {
	if s.invalid != "" {
		return 0, fmt.Errorf("allocate from %s: %s: %w", s.name, s.invalid, errdefs.ErrInvalidArgument)
	}
	if s.rotate {
		i, ok := s.firstFree(s.next, s.n, skip)
		if !ok {
			i, ok = s.firstFree(0, s.next, skip)
		}
		if ok {
			s.next = (i + 1) % s.n
			s.hold(i)
			return i, nil
		}
		return 0, s.exhausted()
	}
	for w := s.low / 64; w < len(s.full); w++ {
		free := ^s.full[w]
		if w == s.low/64 {
			free &^= 1<<(s.low%64) - 1 // below low: all held
		}
		for free != 0 {
			i := w*64 + bits.TrailingZeros64(free)
			if i >= s.n {
				break
			}
			free &^= 1 << (i % 64)
			if skip != nil && skip(i) {
				continue
			}
			if skip == nil {
				s.low = i + 1
			}
			s.hold(i)
			return i, nil
		}
		if skip == nil && w*64+64 <= s.n {
			s.low = max(s.low, w*64+64)
		}
	}
	return 0, s.exhausted()
}

// firstFree returns the first index in [from, to) that is free and not
// skipped, searching a word of the bitmap at a time.
func (s *span) firstFree(from, to int, skip func(int) bool) (int, bool) {
	for w := from / 64; w*64 < to; w++ {
		free := ^s.full[w]
		if w == from/64 {
			free &^= 1<<(from%64) - 1
		}
		for free != 0 {
			i := w*64 + bits.TrailingZeros64(free)
			if i >= to {
				return 0, false
			}
			free &^= 1 << (i % 64)
			if skip == nil || !skip(i) {
				return i, true
			}
		}
	}
	return 0, false
}

func (s *span) exhausted() error {
	return fmt.Errorf("allocate from %s: all %d taken (widen %s, or remove sandboxes): %w",
		s.name, s.n, s.flag, errdefs.ErrResourceExhausted)
}
