package cubevs

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"
)

// ownerElems counts owner's elements per egress set in the kernel.
func ownerElems(t *testing.T, d *Dataplane, owner string) map[string]int {
	t.Helper()
	c, err := d.dpConn()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, set := range egressSetNames {
		elems, err := c.GetSetElements(d.egressSet(set))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range elems {
			if e.Comment == owner {
				out[set]++
			}
		}
	}
	return out
}

// A policy with prefixes gets a chain of its own (nested and repeated
// prefixes are fine), one without has none, and replacing a policy leaves
// nothing of the old one.
func TestEgressPrefixesAndReplace(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	up := newUpstream(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	ep, err := d.Attach(ctx, "sbx-prefixes", ip)
	if err != nil {
		t.Fatal(err)
	}
	priv := netip.AddrPortFrom(up.priv, 80).String()
	allow := EgressPolicy{AllowOut: []netip.Prefix{up.privNet, netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("10.254.0.0/16"), up.privNet}}
	if err := d.SetEgress(ctx, ep.Owner, ip, allow); err != nil {
		t.Fatalf("SetEgress with nested prefixes: %v", err)
	}
	if got := ownerElems(t, d, ep.Owner); got[setSources] != 1 || got[setInternet] != 0 || !hasChain(t, d, outChainName(ep.Owner)) {
		t.Fatalf("elements %v (and the out chain): want one source, no internet, a chain", got)
	}
	mustTalk(t, ep.NetNSPath, priv, "up")
	if err := d.SetEgress(ctx, ep.Owner, ip, allow); err != nil { // again: same policy
		t.Fatal(err)
	}
	if err := d.SetEgress(ctx, ep.Owner, ip, EgressPolicy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	if got := ownerElems(t, d, ep.Owner); got[setInternet] != 1 || got[setSources] != 1 || hasChain(t, d, outChainName(ep.Owner)) {
		t.Fatalf("after the replace: elements %v; the out chain must be gone", got)
	}
	mustBeRejected(t, ep.NetNSPath, priv)
	mustTalk(t, ep.NetNSPath, netip.AddrPortFrom(up.pub, 80).String(), "up")
	if err := d.SetEgress(ctx, ep.Owner, ip, EgressPolicy{AllowInternet: true, DenyOut: []netip.Prefix{up.pubNet}}); err != nil {
		t.Fatal(err)
	}
	mustBeRejected(t, ep.NetNSPath, netip.AddrPortFrom(up.pub, 80).String())
	if err := d.Release(ctx, ep.Owner, nil); err != nil {
		t.Fatal(err)
	}
	if got := ownerElems(t, d, ep.Owner); len(got) != 0 || hasChain(t, d, outChainName(ep.Owner)) {
		t.Fatalf("after Release: elements %v, or the out chain left", got)
	}
	c, err := d.dpConn()
	if err != nil {
		t.Fatal(err)
	}
	if elems, err := c.GetSetElements(d.outRulesMap()); err != nil || len(elems) != 0 {
		t.Fatalf("outrules after Release: %v %v", elems, err)
	}
}

// A sandbox that takes another sandbox's address gets nothing out, even
// when that sandbox may reach the internet and it may not: the policy is
// keyed by address, and the link . address pair is checked first.
func TestEgressSpoofedNeighbourAddress(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	up := newUpstream(t)
	d := openDP(t, cfg)
	ipA := cfg.NodeCIDR.Addr().Next().Next()
	ipB := ipA.Next()
	a, err := d.Attach(ctx, "sbx-closed", ipA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Attach(ctx, "sbx-open", ipB)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetEgress(ctx, a.Owner, ipA, EgressPolicy{}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetEgress(ctx, b.Owner, ipB, EgressPolicy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	pub := netip.AddrPortFrom(up.pub, 80).String()
	mustTalk(t, b.NetNSPath, pub, "up")
	mustBeRejected(t, a.NetNSPath, pub)
	if err := dialFromSpoofed(t, a.NetNSPath, ipB, pub); err == nil {
		t.Fatal("a sandbox reached the internet from its neighbour's address")
	}
}

// A sandbox whose policy an earlier version installed (a chain of its own
// and a verdict map entry) keeps it until SetEgress moves it into the sets,
// which removes the chain and the entry; Release removes them for a
// sandbox never moved.
func TestEgressMovesLegacyChain(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	up := newUpstream(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	moved, err := d.Attach(ctx, "sbx-old", ip)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := d.Attach(ctx, "sbx-old2", ip.Next())
	if err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{moved.Owner, kept.Owner} {
		installLegacyChain(t, d, owner)
	}
	d.dropNFT() // as a restarted agent: the mirror is read from the kernel
	pub := netip.AddrPortFrom(up.pub, 80).String()
	mustTalk(t, moved.NetNSPath, pub, "up") // the legacy chain accepts all
	owners, err := d.EgressOwners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if owners[moved.Owner] || owners[kept.Owner] {
		t.Fatalf("EgressOwners %v counts a legacy chain as installed policy (reconcile would not move it)", owners)
	}
	if err := d.SetEgress(ctx, moved.Owner, ip, EgressPolicy{}); err != nil {
		t.Fatal(err)
	}
	if hasChain(t, d, chainName(moved.Owner)) {
		t.Fatal("legacy chain left after SetEgress")
	}
	mustBeRejected(t, moved.NetNSPath, pub)
	if err := d.Release(ctx, kept.Owner, nil); err != nil {
		t.Fatal(err)
	}
	if hasChain(t, d, chainName(kept.Owner)) {
		t.Fatal("legacy chain left after Release")
	}
	c, err := d.dpConn()
	if err != nil {
		t.Fatal(err)
	}
	if elems, err := c.GetSetElements(d.sandboxesSet()); err != nil || len(elems) != 0 {
		t.Fatalf("verdict map after both: %v %v", elems, err)
	}
}

// installLegacyChain makes owner's policy the way earlier versions did: a
// chain sb-<owner> (here: accept everything) and a verdict map entry from
// its link to it.
func installLegacyChain(t *testing.T, d *Dataplane, owner string) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(d.dpNS)))
	if err != nil {
		t.Fatal(err)
	}
	ch := c.AddChain(&nftables.Chain{Name: chainName(owner), Table: d.table()})
	addRule(c, ch, rule(accept()))
	if err := c.SetAddElements(d.sandboxesSet(), []nftables.SetElement{jumpElement(owner, ch.Name)}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// Policy elements keyed by an address that another owner left behind (its
// link removed by another tool, say) do not pass to the next sandbox given
// that address: SetEgress removes them.
func TestEgressDropsStalePolicyAtAddress(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	if err := d.SetEgress(ctx, "sbx-left", ip, EgressPolicy{AllowInternet: true,
		AllowOut: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetEgress(ctx, "sbx-next", ip, EgressPolicy{}); err != nil {
		t.Fatal(err)
	}
	if got := ownerElems(t, d, "sbx-left"); got[setInternet] != 0 {
		t.Fatalf("the stale owner's grants at %s stayed: %v", ip, got)
	}
	if got := ownerElems(t, d, "sbx-next"); got[setSources] != 1 || got[setInternet] != 0 {
		t.Fatalf("new owner's elements: %v", got)
	}
}
