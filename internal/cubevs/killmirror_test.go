package cubevs

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// nftOwners is what the kernel holds per owner in the dataplane table,
// read through a handle of its own: host ports, elements of the sources
// set (the link . address of each sandbox's policy) and the owners whose
// egress policy is installed.
type nftOwners struct {
	ports    map[string][]uint16
	verdicts map[string]int
	chains   map[string]bool
}

func readNFT(t *testing.T, cfg Config) nftOwners {
	t.Helper()
	ctx := ctxT(t)
	d, err := OpenExisting(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	maps, err := d.Mappings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chains, err := d.EgressOwners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := nftOwners{ports: map[string][]uint16{}, verdicts: map[string]int{}, chains: chains}
	for _, m := range maps {
		out.ports[m.Owner] = append(out.ports[m.Owner], m.HostPort)
	}
	c, err := d.dpConn()
	if err != nil {
		t.Fatal(err)
	}
	elems, err := c.GetSetElements(d.egressSet(setSources))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range elems {
		out.verdicts[e.Comment]++
	}
	return out
}

// A kill (Detach) removes exactly its owner's mappings and egress
// elements, from what the dataplane already knows (no listing); after
// a restart (a new handle on the same kernel state) the index is rebuilt
// from the kernel once; and when another process removed some of the
// owner's objects behind the agent's back (cube node tools open the
// dataplane with OpenExisting and may remove mappings), the kill still
// succeeds at once and leaves every other owner's objects alone.
func TestDetachRemovesExactlyItsOwnObjects(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	// Owner names that prefix each other: matching is by exact owner.
	owners := []string{"sbx-k", "sbx-k2", "sbx-k22", "sbx-other"}
	ip := cfg.NodeCIDR.Addr().Next()
	port := cfg.PortMin
	want := nftOwners{ports: map[string][]uint16{}, verdicts: map[string]int{}, chains: map[string]bool{}}
	for _, o := range owners {
		ip = ip.Next()
		if err := d.SetEgress(ctx, o, ip, EgressPolicy{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
		for guest := uint16(80); guest < 82; guest++ {
			if err := d.AddMapping(ctx, Mapping{Owner: o, HostPort: port, SandboxIP: ip, GuestPort: guest}); err != nil {
				t.Fatal(err)
			}
			want.ports[o] = append(want.ports[o], port)
			port++
		}
		want.verdicts[o], want.chains[o] = 1, true
	}
	check := func(step string) {
		t.Helper()
		got := readNFT(t, cfg)
		if fmt.Sprint(got.ports) != fmt.Sprint(want.ports) || fmt.Sprint(got.verdicts) != fmt.Sprint(want.verdicts) ||
			fmt.Sprint(got.chains) != fmt.Sprint(want.chains) {
			t.Fatalf("%s: kernel holds %+v, want %+v", step, got, want)
		}
	}
	check("created")
	forget := func(o string) {
		delete(want.ports, o)
		delete(want.verdicts, o)
		delete(want.chains, o)
	}

	// 1. With the index warm.
	if err := d.Detach(ctx, "sbx-k2"); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	forget("sbx-k2")
	check("after detaching sbx-k2")

	// 2. One of sbx-k's mappings removed by another handle: the agent's
	// index still lists it.
	tool, err := OpenExisting(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tool.RemoveMapping(ctx, want.ports["sbx-k"][0]); err != nil {
		t.Fatal(err)
	}
	tool.Close()
	if err := d.Detach(ctx, "sbx-k"); err != nil {
		t.Fatalf("Detach after a mapping went behind the agent's back: %v", err)
	}
	forget("sbx-k")
	check("after detaching sbx-k")

	// 3. Restart: a new handle rebuilds its index from the kernel.
	d.Close()
	d2, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if err := d2.Detach(ctx, "sbx-k22"); err != nil {
		t.Fatalf("Detach after restart: %v", err)
	}
	forget("sbx-k22")
	check("after restart and detaching sbx-k22")

	// A port freed by a kill is free to the next create, through the index.
	freed := cfg.PortMin
	if err := d2.AddMapping(ctx, Mapping{Owner: "sbx-new", HostPort: freed, SandboxIP: cfg.NodeCIDR.Addr().Next().Next(), GuestPort: 80}); err != nil {
		t.Fatalf("mapping a freed port: %v", err)
	}
	// A port still held is refused, naming the holder.
	held := want.ports["sbx-other"][0]
	err = d2.AddMapping(ctx, Mapping{Owner: "sbx-new", HostPort: held, SandboxIP: cfg.NodeCIDR.Addr().Next().Next(), GuestPort: 81})
	if err == nil || !containsAll(err.Error(), "sbx-other", "sbx-new") {
		t.Fatalf("mapping a held port: %v, want a conflict naming both owners", err)
	}
	want.ports["sbx-new"] = []uint16{freed}
	check("after mapping a freed port")
	// Detaching an owner with nothing left is fine, twice.
	for i := 0; i < 2; i++ {
		if err := d2.Detach(ctx, "sbx-k"); err != nil {
			t.Fatalf("Detach of a gone owner: %v", err)
		}
	}
	check("after detaching a gone owner")
}

// A create never fails on leftovers the agent does not know of: a mapping
// removed, or a chain and verdict entry removed, behind its back.
func TestCreateAfterObjectsRemovedBehindTheIndex(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	m := Mapping{Owner: "sbx-behind", HostPort: cfg.PortMin, SandboxIP: ip, GuestPort: 80}
	if err := d.SetEgress(ctx, m.Owner, ip, EgressPolicy{}); err != nil {
		t.Fatal(err)
	}
	if err := d.AddMapping(ctx, m); err != nil {
		t.Fatal(err)
	}
	// Another process removes everything of sbx-behind.
	tool, err := OpenExisting(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tool.Detach(ctx, m.Owner); err != nil {
		t.Fatal(err)
	}
	tool.Close()
	// The agent re-maps the same port to another guest port (a replace in
	// its index, whose old element is gone from the kernel).
	m.GuestPort = 81
	if err := d.AddMapping(ctx, m); err != nil {
		t.Fatalf("AddMapping after its old element went: %v", err)
	}
	if err := d.SetEgress(ctx, m.Owner, ip, EgressPolicy{}); err != nil {
		t.Fatalf("SetEgress after its elements went: %v", err)
	}
	got := readNFT(t, cfg)
	if !slices.Equal(got.ports[m.Owner], []uint16{m.HostPort}) || got.verdicts[m.Owner] != 1 || !got.chains[m.Owner] {
		t.Fatalf("kernel holds %+v, want sbx-behind's mapping and egress policy", got)
	}
	if err := d.Detach(ctx, m.Owner); err != nil {
		t.Fatal(err)
	}
	if got := readNFT(t, cfg); len(got.ports)+len(got.verdicts)+len(got.chains) != 0 {
		t.Fatalf("after Detach the kernel holds %+v", got)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// Release removes, with the owner's objects, the mappings of the host
// ports it is given whoever owns them (a sandbox's recorded ports: a
// stale owner's mapping of one of them goes too), skips ports the map does
// not hold, and leaves every other mapping alone.
func TestRelease(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	p := cfg.PortMin
	for _, m := range []Mapping{
		{Owner: "sbx-a", HostPort: p, SandboxIP: ip, GuestPort: 80},
		{Owner: "sbx-stale", HostPort: p + 1, SandboxIP: ip.Next(), GuestPort: 81},
		{Owner: "sbx-b", HostPort: p + 2, SandboxIP: ip.Next().Next(), GuestPort: 80},
	} {
		if err := d.AddMapping(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.SetEgress(ctx, "sbx-a", ip, EgressPolicy{AllowInternet: true}); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, "sbx-a", []uint16{p, p + 1, p + 3}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	got := readNFT(t, cfg)
	if fmt.Sprint(got.ports) != fmt.Sprint(map[string][]uint16{"sbx-b": {p + 2}}) || len(got.verdicts) != 0 || len(got.chains) != 0 {
		t.Fatalf("kernel holds %+v, want only sbx-b's mapping", got)
	}
	// Again: nothing left of sbx-a, nothing to do.
	if err := d.Release(ctx, "sbx-a", []uint16{p, p + 1}); err != nil {
		t.Fatalf("Release of a gone owner: %v", err)
	}
}
