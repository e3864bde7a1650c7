package cubevs

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// EgressPolicy is what a sandbox may open connections to (E2B semantics:
// AllowOut wins over DenyOut). Replies to inbound mapped connections are
// always allowed. Whatever the policy, a sandbox can never reach other
// sandboxes (NodeCIDR), the host (the transit subnet and every host
// address) or link-local/metadata addresses (169.254.0.0/16). Private
// ranges (10/8, 172.16/12, 192.168/16, 100.64/10) are denied unless listed
// in AllowOut. With AllowInternet, DNS (udp/tcp 53) to the resolvers in
// ResolvConf is allowed even when they are private or host addresses.
//
// The type is the node protocol's (nodeproto): the control plane states the
// policy, this package enforces it.
type EgressPolicy = nodeproto.EgressPolicy

var (
	privateRanges = []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("100.64.0.0/10"),
	}
	linkLocalRange = netip.MustParsePrefix("169.254.0.0/16")
)

// SetEgress installs or replaces owner's egress policy atomically: chain
// sb-<owner> is flushed and refilled, and the sandboxes verdict map sends
// traffic entering from LinkName(owner) to it. The host address set is
// refreshed at the same time. The policy takes effect for new connections
// at once; ip is the sandbox address (anything else from its link is
// dropped, so a sandbox cannot borrow another's address or policy).
func (d *Dataplane) SetEgress(ctx context.Context, owner string, ip netip.Addr, p EgressPolicy) (err error) {
	if err := d.cfg.validOwner(owner); err != nil {
		return err
	}
	if err := d.cfg.validSandboxIP(ip); err != nil {
		return err
	}
	for _, pr := range append(append([]netip.Prefix{}, p.AllowOut...), p.DenyOut...) {
		if !pr.IsValid() || !pr.Addr().Is4() {
			return fmt.Errorf("egress of %s: %q is not an IPv4 prefix (sandboxes have no IPv6): %w",
				owner, pr, errdefs.ErrInvalidArgument)
		}
	}
	unlock, err := d.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	hostAddrs, err := d.hostAddrs()
	if err != nil {
		return err
	}
	return d.retryStale(func(c *nftables.Conn, mi *nftMirror) error {
		if err := d.fillAddrSets(c, hostAddrs, resolvers()); err != nil {
			return err
		}
		ch := c.AddChain(&nftables.Chain{Name: chainName(owner), Table: d.table()})
		c.FlushChain(ch)
		for _, r := range d.egressRules(ip, p) {
			addRule(c, ch, r)
		}
		key := ifNameKey(LinkName(owner))
		el := nftables.SetElement{
			Key:         key,
			VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name},
			Comment:     owner,
		}
		if err := c.SetAddElements(d.sandboxesSet(), []nftables.SetElement{el}); err != nil {
			return fmt.Errorf("egress of %s: %w", owner, err)
		}
		if err := flush(c, "egress of %s", owner); err != nil {
			return err
		}
		mi.chains[owner] = true
		mi.putVerdict(string(key), owner)
		return nil
	})
}

// egressRules is the body of chain sb-<owner>, first match wins.
func (d *Dataplane) egressRules(ip netip.Addr, p EgressPolicy) [][]expr.Any {
	hostSet, dnsSet := d.addrSet(setHostAddrs), d.addrSet(setDNS)
	rules := [][]expr.Any{rule(notSaddr(hostPrefix(ip)), drop())}
	if p.AllowInternet {
		for _, proto := range l4protos {
			rules = append(rules, rule(daddrInSet(dnsSet), l4proto(proto), dport(53), accept()))
		}
	}
	for _, never := range []netip.Prefix{d.cfg.NodeCIDR, d.cfg.Transit, linkLocalRange} {
		rules = append(rules, rule(daddr(never), reject()))
	}
	rules = append(rules, rule(daddrInSet(hostSet), reject()))
	for _, pr := range p.AllowOut {
		rules = append(rules, rule(daddr(pr), accept()))
	}
	for _, pr := range p.DenyOut {
		rules = append(rules, rule(daddr(pr), reject()))
	}
	if p.AllowInternet {
		for _, pr := range privateRanges {
			rules = append(rules, rule(daddr(pr), reject()))
		}
		rules = append(rules, rule(accept()))
	}
	return append(rules, rule(reject()))
}

// removeOwnerNFT deletes, in one transaction, owner's port mappings, its
// verdict map entry and its egress chain. Absent pieces are fine. What to
// delete comes from the mirror (by owner: a handful of map lookups), so a
// kill reads nothing from the kernel whatever the number of sandboxes.
//
// hostPorts are more mappings to delete in the same transaction whoever
// owns them (a sandbox's recorded ports; RemoveMapping would take a
// transaction each); those the port map does not hold are skipped.
func (d *Dataplane) removeOwnerNFT(owner string, hostPorts []uint16) error {
	return d.retryStale(func(c *nftables.Conn, mi *nftMirror) error {
		ports := mi.portsOfOwner(owner)
		for _, hp := range hostPorts {
			if _, ok := mi.ports[hp]; ok && !slices.Contains(ports, hp) {
				ports = append(ports, hp)
			}
		}
		if err := d.queueUnmap(c, ports); err != nil {
			return err
		}
		keys := mi.verdictKeysOf(owner)
		if len(keys) > 0 {
			gone := make([]nftables.SetElement, 0, len(keys))
			for _, k := range keys {
				gone = append(gone, nftables.SetElement{Key: []byte(k)})
			}
			if err := c.SetDeleteElements(d.sandboxesSet(), gone); err != nil {
				return fmt.Errorf("delete from %s: %w", setSandboxes, err)
			}
		}
		chain := mi.chains[owner]
		if chain {
			ch := &nftables.Chain{Name: chainName(owner), Table: d.table()}
			c.FlushChain(ch)
			c.DelChain(ch)
		}
		if len(ports) == 0 && len(keys) == 0 && !chain {
			return nil
		}
		if err := flush(c, "remove nftables objects of %s", owner); err != nil {
			return err
		}
		for _, hp := range ports {
			mi.forgetPort(hp)
		}
		for _, k := range keys {
			mi.forgetVerdict(k)
		}
		delete(mi.chains, owner)
		return nil
	})
}

// EgressOwners lists the owners whose egress chain is installed, read from
// the kernel in one dump (reconcile re-applies policy only where missing).
func (d *Dataplane) EgressOwners(ctx context.Context) (_ map[string]bool, err error) {
	unlock, err := d.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	fresh := d.nftm == nil // then mirror reads the kernel now
	out := map[string]bool{}
	err = d.tryOnce(func(c *nftables.Conn, mi *nftMirror) error {
		if !fresh {
			chains, err := c.ListChainsOfTableFamily(d.table().Family)
			if err != nil {
				return fmt.Errorf("list egress chains: %w", err)
			}
			mi.setChains(d.table().Name, chains)
		}
		maps.Copy(out, mi.chains)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
