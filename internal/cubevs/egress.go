package cubevs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"

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

// SetEgress installs or replaces owner's egress policy atomically: its
// elements in the egress sets and its out chain are brought to what p asks
// (see egressset.go), and a chain sb-<owner> an earlier version made for it
// goes in the same transaction. The host address set is refreshed at the
// same time. The policy takes effect for new connections at once; ip is
// the sandbox address (anything else from its link is dropped, so a
// sandbox cannot borrow another's address or policy).
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
		want := egressElems(owner, ip, p)
		if err := d.queueEgressChanges(c, owner, mi.egress[owner], want); err != nil {
			return fmt.Errorf("egress of %s: %w", owner, err)
		}
		stale := mi.othersAt(owner, ip)
		for other, elems := range stale {
			if err := d.queueEgressChanges(c, other, elems, nil); err != nil {
				return fmt.Errorf("egress of %s: stale policy of %s: %w", owner, other, err)
			}
		}
		outs, err := d.queueOutChain(c, mi, owner, p)
		if err != nil {
			return fmt.Errorf("egress of %s: %w", owner, err)
		}
		legacy, err := d.queueLegacyRemoval(c, mi, owner)
		if err != nil {
			return err
		}
		if err := flush(c, "egress of %s", owner); err != nil {
			return err
		}
		outs()
		legacy()
		mi.egress[owner] = want
		for other, elems := range stale {
			mi.forgetEgress(other, elems)
		}
		return nil
	})
}

// queueLegacyRemoval queues deleting owner's verdict map entries and chain
// sb-<owner> (per-sandbox policy as earlier versions installed it) and
// returns what to forget in the mirror once the batch is committed.
func (d *Dataplane) queueLegacyRemoval(c *nftables.Conn, mi *nftMirror, owner string) (committed func(), err error) {
	keys, chain := mi.verdictKeysOf(owner), ""
	if mi.chains[owner] {
		chain = chainName(owner)
	}
	if err := d.queueJumpRemoval(c, d.sandboxesSet(), keys, chain); err != nil {
		return nil, err
	}
	return func() {
		for _, k := range keys {
			mi.forgetVerdict(k)
		}
		delete(mi.chains, owner)
	}, nil
}

// removeOwnerNFT deletes, in one transaction, owner's port mappings, its
// egress elements and out chain (and an earlier version's verdict map
// entry and chain). Absent pieces are fine. What to delete comes from the
// mirror (by owner: a handful of map lookups), so a kill reads nothing
// from the kernel whatever the number of sandboxes.
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
		keys, chain, elems := mi.verdictKeysOf(owner), mi.chains[owner], mi.egress[owner]
		if len(ports) == 0 && len(keys) == 0 && !chain && len(elems) == 0 && !mi.outs[owner] {
			return nil
		}
		if err := d.queueEgressChanges(c, owner, elems, nil); err != nil {
			return err
		}
		outs, err := d.queueOutChainRemoval(c, mi, owner)
		if err != nil {
			return err
		}
		legacy, err := d.queueLegacyRemoval(c, mi, owner)
		if err != nil {
			return err
		}
		if err := flush(c, "remove nftables objects of %s", owner); err != nil {
			return err
		}
		for _, hp := range ports {
			mi.forgetPort(hp)
		}
		outs()
		legacy()
		delete(mi.egress, owner)
		return nil
	})
}

// EgressOwners lists the owners whose egress policy is installed in the
// egress sets, read from the kernel (reconcile re-applies policy only where
// missing; a policy an earlier version installed as a chain of its own is
// missing here, so reconcile moves it into the sets).
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
			if err := d.readEgress(c, mi); err != nil {
				return err
			}
		}
		for owner := range mi.egress {
			if mi.hasPolicy(owner) {
				out[owner] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
