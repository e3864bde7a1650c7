package cubevs

import (
	"fmt"
	"maps"
	"net/netip"
	"testing"
)

// The dataplane answers AddMapping from its mirror of the port map; after
// any sequence of its own adds, replacements, removals and detaches the
// mirror must equal what the kernel holds (read by a second handle).
func TestPortMirrorFollowsKernel(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ipA, ipB := cfg.NodeCIDR.Addr().Next().Next(), cfg.NodeCIDR.Addr().Next().Next().Next()
	if _, err := d.Attach(ctx, "sbx-mirror-a", ipA); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Attach(ctx, "sbx-mirror-b", ipB); err != nil {
		t.Fatal(err)
	}
	p := cfg.PortMin
	add := func(owner string, hostPort uint16, ip netip.Addr, guest uint16) func() error {
		return func() error {
			return d.AddMapping(ctx, Mapping{Owner: owner, HostPort: hostPort, SandboxIP: ip, GuestPort: guest})
		}
	}
	steps := []func() error{
		add("sbx-mirror-a", p, ipA, 80),
		add("sbx-mirror-a", p+1, ipA, 81),
		add("sbx-mirror-b", p+2, ipB, 82),
		// Same owner, new guest port: replaced in place.
		add("sbx-mirror-a", p+1, ipA, 91),
		func() error { return d.RemoveMapping(ctx, p) },
		func() error { return d.Detach(ctx, "sbx-mirror-a") },
		add("sbx-mirror-b", p, ipB, 83),
	}
	other := openDP(t, cfg)
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		d.mu.Lock()
		var mirror map[uint16]Mapping
		if d.nftm != nil {
			mirror = maps.Clone(d.nftm.ports)
		}
		d.mu.Unlock()
		kernel, err := other.Mappings(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint16]Mapping{}
		for _, m := range kernel {
			want[m.HostPort] = m
		}
		if fmt.Sprint(mirror) != fmt.Sprint(want) {
			t.Fatalf("after step %d: mirror %v, kernel %v", i, mirror, want)
		}
	}
	// A conflicting add fails, names both owners, and leaves both in step.
	if err := d.AddMapping(ctx, Mapping{Owner: "sbx-mirror-x", HostPort: p, SandboxIP: ipB, GuestPort: 83}); err == nil {
		t.Fatal("conflicting add accepted")
	}
	if got, _ := d.Mappings(ctx); len(got) != 2 {
		t.Fatalf("mappings after a refused add: %v", got)
	}
}
