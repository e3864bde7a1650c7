package cubevs

import (
	"encoding/binary"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Small builders for the nftables expressions this package uses. Each
// returns a slice so rules read as concatenations of matches.

const ifNameSize = 16

// ifNameKey pads an interface name to the 16 bytes meta iifname loads.
func ifNameKey(name string) []byte {
	b := make([]byte, ifNameSize)
	copy(b, name)
	return b
}

func metaIfName(key expr.MetaKey, op expr.CmpOp, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifNameKey(name)},
	}
}

func iif(name string) []expr.Any    { return metaIfName(expr.MetaKeyIIFNAME, expr.CmpOpEq, name) }
func notIIF(name string) []expr.Any { return metaIfName(expr.MetaKeyIIFNAME, expr.CmpOpNeq, name) }
func oif(name string) []expr.Any    { return metaIfName(expr.MetaKeyOIFNAME, expr.CmpOpEq, name) }
func notOIF(name string) []expr.Any { return metaIfName(expr.MetaKeyOIFNAME, expr.CmpOpNeq, name) }

// iifPrefix matches input interface names starting with prefix ("cv*").
func iifPrefix(prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)},
	}
}

func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// loadDport loads the transport destination port (TCP and UDP) into reg 1.
func loadDport() expr.Any {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

func dportRange(min, max uint16) []expr.Any {
	return []expr.Any{
		loadDport(),
		&expr.Range{Op: expr.CmpOpEq, Register: 1,
			FromData: binaryutil.BigEndian.PutUint16(min), ToData: binaryutil.BigEndian.PutUint16(max)},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{loadDport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)}}
}

// ipMatch matches the IPv4 source (offset 12) or destination (offset 16)
// against a prefix.
func ipMatch(offset uint32, op expr.CmpOp, p netip.Prefix) []expr.Any {
	p = p.Masked()
	a := p.Addr().As4()
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}}
	if p.Bits() < 32 {
		mask := make([]byte, 4)
		binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	return append(out, &expr.Cmp{Op: op, Register: 1, Data: a[:]})
}

func saddr(p netip.Prefix) []expr.Any { return ipMatch(12, expr.CmpOpEq, p) }
func daddr(p netip.Prefix) []expr.Any { return ipMatch(16, expr.CmpOpEq, p) }

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 32) }

// daddrInSet matches the IPv4 destination against a named set.
func daddrInSet(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// iifVerdictMap looks the input interface's name up in a verdict map and
// applies the verdict found (jump to its chain); no entry, no verdict.
func iifVerdictMap(m *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
	}
}

// jumpElement is the verdict-map element that sends what enters by owner's
// link to chain.
func jumpElement(owner, chain string) nftables.SetElement {
	return nftables.SetElement{Key: ifNameKey(LinkName(owner)),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}, Comment: owner}
}

// saddrInSet matches the IPv4 source against a named set.
func saddrInSet(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// linkSourceNotIn matches packets whose input interface . IPv4 source is
// not in a named set (ifname . ipv4_addr): the interface name fills the
// first four 32-bit registers, the address the fifth.
func linkSourceNotIn(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, // NFT_REG32_04
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
	}
}

// ctState matches any of the given conntrack state bits.
func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ctStatusDNAT matches connections whose destination was NATed.
func ctStatusDNAT() []expr.Any {
	const ipsDstNAT = 1 << 5
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// fibDaddrLocal matches packets addressed to one of this netns' addresses.
func fibDaddrLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// dnatTo rewrites the destination address, keeping the port.
func dnatTo(a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: b[:]},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}

func accept() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }
func drop() expr.Any   { return &expr.Verdict{Kind: expr.VerdictDrop} }

// rejectICMP answers with ICMP "administratively prohibited".
func rejectICMP() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13} }

// rejectTCP answers with a TCP reset (not subject to ICMP rate limits).
func rejectTCP() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_TCP_RST} }

// reject sends the packet to the deny chain, which refuses TCP with a reset
// and everything else with ICMP admin-prohibited, so a denied connect fails
// at once instead of timing out.
func reject() expr.Any { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainDeny} }

// rule concatenates expression groups.
func rule(parts ...any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case expr.Any:
			out = append(out, v)
		case []expr.Any:
			out = append(out, v...)
		default:
			panic("cubevs: rule part must be expr.Any or []expr.Any")
		}
	}
	return out
}
