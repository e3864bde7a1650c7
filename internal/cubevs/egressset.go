package cubevs

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
)

// Every sandbox's egress policy is data read by one shared chain (egress):
// its link and address in the sources set, its address in the internet set
// when it may reach the internet. Only a sandbox with AllowOut or DenyOut
// prefixes has a chain of its own (out-<owner>: those prefixes, nothing
// else), reached through the outrules verdict map from the shared chain.
//
// Before, every sandbox had a chain sb-<owner> with its whole policy,
// reached through the sandboxes verdict map. Adding a verdict that jumps
// to a chain makes the kernel validate the whole table, every chain of
// every sandbox, so the nftables part of a create grew with the sandboxes
// resident (0.41 ms at 10, 2.45 ms at 2000: BenchmarkSetEgress) and a
// create at 2000 resident took 1.85x its time at 0. Adding set elements
// validates nothing; now only sandboxes with prefixes add jumps, and the
// walk covers only their chains. (Prefixes as ranges in a set of address
// pairs were tried: the kernel's set type for those, pipapo, took 8 ms to
// delete one element of 2000, under the dataplane lock of every kill.)
//
//	set sources  ifname . ipv4_addr        (a sandbox's link and address: anti-spoofing, and the mark of an installed policy)
//	set internet ipv4_addr                 (sandboxes with AllowInternet)
//	map outrules ifname : verdict          (link -> jump out-<owner>, for sandboxes with prefixes)
//
// Every element's comment is its owner.
const (
	setSources  = "sources"
	setInternet = "internet"
	setOutRules = "outrules"

	// chainEgress holds the egress rules of every sandbox (see egressRules).
	chainEgress = "egress"
)

// egressSetNames lists the sets that hold egress policy as elements.
var egressSetNames = []string{setSources, setInternet}

// outChainName is the chain of owner's AllowOut and DenyOut prefixes.
func outChainName(owner string) string { return "out-" + owner }

func (d *Dataplane) egressSet(name string) *nftables.Set {
	if name == setSources {
		return &nftables.Set{Table: d.table(), Name: name, Concatenation: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)}
	}
	return &nftables.Set{Table: d.table(), Name: name, KeyType: nftables.TypeIPAddr}
}

func (d *Dataplane) outRulesMap() *nftables.Set {
	return &nftables.Set{Table: d.table(), Name: setOutRules, IsMap: true,
		KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.BigEndian}
}

// egressRules is the egress chain, shared by every sandbox; first match
// wins, in the order the per-sandbox chains had: anti-spoofing, DNS to the
// resolvers (with internet), never the node's sandboxes, the transit
// subnet, link-local or the host, then the sandbox's own prefixes (AllowOut
// accepted, then DenyOut refused, in its out-<owner> chain), private ranges
// and the rest of the internet (with internet), else refused.
func (d *Dataplane) egressRules() [][]expr.Any {
	hostSet, dnsSet := d.addrSet(setHostAddrs), d.addrSet(setDNS)
	sources, internet, outs := d.egressSet(setSources), d.egressSet(setInternet), d.outRulesMap()
	rules := [][]expr.Any{rule(linkSourceNotIn(sources), drop())}
	for _, proto := range l4protos {
		rules = append(rules, rule(saddrInSet(internet), daddrInSet(dnsSet), l4proto(proto), dport(53), accept()))
	}
	for _, never := range []netip.Prefix{d.cfg.NodeCIDR, d.cfg.Transit, linkLocalRange} {
		rules = append(rules, rule(daddr(never), reject()))
	}
	rules = append(rules,
		rule(daddrInSet(hostSet), reject()),
		iifVerdictMap(outs))
	for _, pr := range privateRanges {
		rules = append(rules, rule(saddrInSet(internet), daddr(pr), reject()))
	}
	return append(rules, rule(saddrInSet(internet), accept()), rule(reject()))
}

// outRules is the body of chain out-<owner>: AllowOut accepted, then
// DenyOut refused (AllowOut wins); anything else returns to the egress
// chain.
func outRules(p EgressPolicy) [][]expr.Any {
	var rules [][]expr.Any
	for _, pr := range p.AllowOut {
		rules = append(rules, rule(daddr(pr), accept()))
	}
	for _, pr := range p.DenyOut {
		rules = append(rules, rule(daddr(pr), reject()))
	}
	return rules
}

// egressElem is one element of an egress set.
type egressElem struct {
	set string
	key []byte
}

func (e egressElem) equal(o egressElem) bool { return e.set == o.set && bytes.Equal(e.key, o.key) }

// egressElems is owner's policy p as set elements (ip is its address).
func egressElems(owner string, ip netip.Addr, p EgressPolicy) []egressElem {
	a := ip.As4()
	out := []egressElem{{set: setSources, key: append(ifNameKey(LinkName(owner)), a[:]...)}}
	if p.AllowInternet {
		out = append(out, egressElem{set: setInternet, key: a[:]})
	}
	return out
}

// queueEgressChanges queues turning owner's elements in the mirror (have)
// into want: deletes of what is no longer wanted, adds of everything wanted.
// Adding an element the set holds already is no error, and adding them all
// restores any that something removed behind the mirror's back (a delete
// of such an element fails the batch instead, and retryStale runs it again
// against a fresh read).
func (d *Dataplane) queueEgressChanges(c *nftables.Conn, owner string, have, want []egressElem) error {
	bySet := func(elems []egressElem, except []egressElem) map[string][]nftables.SetElement {
		out := map[string][]nftables.SetElement{}
		for _, e := range elems {
			if !slices.ContainsFunc(except, e.equal) {
				out[e.set] = append(out[e.set], nftables.SetElement{Key: e.key, Comment: owner})
			}
		}
		return out
	}
	for set, gone := range bySet(have, want) {
		if err := c.SetDeleteElements(d.egressSet(set), gone); err != nil {
			return fmt.Errorf("delete from %s: %w", set, err)
		}
	}
	for set, added := range bySet(want, nil) {
		if err := c.SetAddElements(d.egressSet(set), added); err != nil {
			return fmt.Errorf("add to %s: %w", set, err)
		}
	}
	return nil
}

// queueOutChain queues owner's out-<owner> chain and its outrules entry as
// p asks: (re)filled when p has prefixes, removed when it has none and the
// mirror holds them. It returns what to record in the mirror once the batch
// is committed.
func (d *Dataplane) queueOutChain(c *nftables.Conn, mi *nftMirror, owner string, p EgressPolicy) (committed func(), err error) {
	if len(p.AllowOut)+len(p.DenyOut) == 0 {
		return d.queueOutChainRemoval(c, mi, owner)
	}
	ch := c.AddChain(&nftables.Chain{Name: outChainName(owner), Table: d.table()})
	c.FlushChain(ch)
	for _, r := range outRules(p) {
		addRule(c, ch, r)
	}
	if err := c.SetAddElements(d.outRulesMap(), []nftables.SetElement{jumpElement(owner, ch.Name)}); err != nil {
		return nil, fmt.Errorf("add to %s: %w", setOutRules, err)
	}
	return func() { mi.outs[owner] = true }, nil
}

// queueOutChainRemoval queues deleting owner's outrules entry and chain
// when the mirror holds them.
func (d *Dataplane) queueOutChainRemoval(c *nftables.Conn, mi *nftMirror, owner string) (committed func(), err error) {
	if !mi.outs[owner] {
		return func() {}, nil
	}
	if err := d.queueJumpRemoval(c, d.outRulesMap(), []string{string(ifNameKey(LinkName(owner)))}, outChainName(owner)); err != nil {
		return nil, err
	}
	return func() { delete(mi.outs, owner) }, nil
}

// queueJumpRemoval queues deleting the keys of verdict map m and the chain
// they jump to (none of either: nothing).
func (d *Dataplane) queueJumpRemoval(c *nftables.Conn, m *nftables.Set, keys []string, chain string) error {
	if len(keys) > 0 {
		gone := make([]nftables.SetElement, 0, len(keys))
		for _, k := range keys {
			gone = append(gone, nftables.SetElement{Key: []byte(k)})
		}
		if err := c.SetDeleteElements(m, gone); err != nil {
			return fmt.Errorf("delete from %s: %w", m.Name, err)
		}
	}
	if chain != "" {
		ch := &nftables.Chain{Name: chain, Table: d.table()}
		c.FlushChain(ch)
		c.DelChain(ch)
	}
	return nil
}

// Mirror part: the egress elements of each owner, and who has an out chain.

// readEgress reads the egress sets and the outrules map into m.
func (d *Dataplane) readEgress(c *nftables.Conn, m *nftMirror) error {
	m.egress = map[string][]egressElem{}
	for _, set := range egressSetNames {
		elems, err := c.GetSetElements(d.egressSet(set))
		if err != nil {
			return fmt.Errorf("read %s: %w", set, err)
		}
		for _, e := range elems {
			if e.Comment != "" {
				m.egress[e.Comment] = append(m.egress[e.Comment], egressElem{set: set, key: e.Key})
			}
		}
	}
	outs, err := c.GetSetElements(d.outRulesMap())
	if err != nil {
		return fmt.Errorf("read %s: %w", setOutRules, err)
	}
	m.outs = map[string]bool{}
	for _, e := range outs {
		if e.Comment != "" {
			m.outs[e.Comment] = true
		}
	}
	return nil
}

// othersAt returns the elements of owners other than owner that name the
// address ip in the internet set. An owner's elements go with it (Release,
// Detach) before its address is handed out again; should some be left all
// the same (another tool removed its link), they would grant the internet
// to the next sandbox at that address, so SetEgress removes them. (The
// sources set and the out chains are keyed by link, which differs.) A scan
// of the mirror: a few microseconds with 2000 sandboxes.
func (m *nftMirror) othersAt(owner string, ip netip.Addr) map[string][]egressElem {
	a := ip.As4()
	out := map[string][]egressElem{}
	for o, es := range m.egress {
		if o == owner {
			continue
		}
		for _, e := range es {
			if e.set == setInternet && bytes.Equal(e.key, a[:]) {
				out[o] = append(out[o], e)
			}
		}
	}
	return out
}

// forgetEgress drops elems from owner's elements in the mirror.
func (m *nftMirror) forgetEgress(owner string, elems []egressElem) {
	m.egress[owner] = slices.DeleteFunc(m.egress[owner], func(e egressElem) bool {
		return slices.ContainsFunc(elems, e.equal)
	})
	if len(m.egress[owner]) == 0 {
		delete(m.egress, owner)
	}
}

// hasPolicy reports whether owner's policy is installed (its sources
// element is the mark).
func (m *nftMirror) hasPolicy(owner string) bool {
	return slices.ContainsFunc(m.egress[owner], func(e egressElem) bool { return e.set == setSources })
}
