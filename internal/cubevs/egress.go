package cubevs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"

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
	c, err := d.dpConn()
	if err != nil {
		return err
	}
	defer d.settleNFT(&err)
	if err := d.fillAddrSets(c, hostAddrs, resolvers()); err != nil {
		return err
	}
	ch := c.AddChain(&nftables.Chain{Name: chainName(owner), Table: d.table()})
	c.FlushChain(ch)
	for _, r := range d.egressRules(ip, p) {
		addRule(c, ch, r)
	}
	vm := d.sandboxesSet()
	el := nftables.SetElement{
		Key:         ifNameKey(LinkName(owner)),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name},
		Comment:     owner,
	}
	if err := c.SetAddElements(vm, []nftables.SetElement{el}); err != nil {
		return fmt.Errorf("egress of %s: %w", owner, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("egress of %s: %w", owner, err)
	}
	return nil
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
// verdict map entry and its egress chain. Absent pieces are fine.
func (d *Dataplane) removeOwnerNFT(owner string) (err error) {
	c, err := d.dpConn()
	if err != nil {
		return err
	}
	defer d.settleNFT(&err)
	var errs []error
	queue := func(set *nftables.Set, match func(nftables.SetElement) bool) {
		elems, err := c.GetSetElements(set)
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", set.Name, err))
			return
		}
		var gone []nftables.SetElement
		for _, e := range elems {
			if match(e) {
				gone = append(gone, nftables.SetElement{Key: e.Key})
			}
		}
		if len(gone) > 0 {
			if err := c.SetDeleteElements(set, gone); err != nil {
				errs = append(errs, fmt.Errorf("delete from %s: %w", set.Name, err))
			}
		}
	}
	// The port map is read from the mirror (see portsOf), the verdict map
	// from the kernel.
	ports, err := d.portsOf(c)
	if err != nil {
		return err
	}
	unmapped, err := d.queueUnmap(c, ports, func(m Mapping) bool { return m.Owner == owner })
	if err != nil {
		errs = append(errs, err)
	}
	key := ifNameKey(LinkName(owner))
	queue(d.sandboxesSet(), func(e nftables.SetElement) bool { return e.Comment == owner || bytes.Equal(e.Key, key) })
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		errs = append(errs, fmt.Errorf("list chains: %w", err))
	}
	for _, ch := range chains {
		if ch.Table.Name == d.cfg.TablePrefix && ch.Name == chainName(owner) {
			c.FlushChain(ch)
			c.DelChain(ch)
		}
	}
	if err := c.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("remove nftables objects of %s: %w", owner, err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	forget(ports, unmapped)
	return nil
}

// EgressOwners lists the owners whose egress chain is installed, read from
// the kernel in one dump (reconcile re-applies policy only where missing).
func (d *Dataplane) EgressOwners(ctx context.Context) (_ map[string]bool, err error) {
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
	chains, err := c.ListChainsOfTableFamily(d.table().Family)
	if err != nil {
		return nil, fmt.Errorf("list egress chains: %w", err)
	}
	out := map[string]bool{}
	for _, ch := range chains {
		if ch.Table == nil || ch.Table.Name != d.table().Name {
			continue
		}
		if owner, ok := bytes.CutPrefix([]byte(ch.Name), []byte("sb-")); ok {
			out[string(owner)] = true
		}
	}
	return out, nil
}
