package cubevs

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// TestRenameHandsEndpointToNewOwner is the warm pool's take: a slot's
// endpoint becomes a sandbox's, with the pin, link name and alias of the
// new owner, and traffic through a mapping works afterwards.
func TestRenameHandsEndpointToNewOwner(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	if _, err := d.Attach(ctx, "pool-slot1", ip); err != nil {
		t.Fatal(err)
	}
	ep, err := d.Rename(ctx, "pool-slot1", "sbx-taken", ip)
	if err != nil {
		t.Fatal(err)
	}
	if ep.NetNSPath != cfg.sandboxPin("sbx-taken") || ep.LinkName != LinkName("sbx-taken") {
		t.Fatalf("endpoint %+v", ep)
	}
	eps, err := d.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0].Owner != "sbx-taken" || eps[0].IP != ip || eps[0].NetNSPath == "" {
		t.Fatalf("endpoints after rename: %+v", eps)
	}
	if ok, _ := isPinned(cfg.sandboxPin("pool-slot1")); ok {
		t.Fatal("old pin still mounted")
	}
	serveTag(t, ep.NetNSPath, fmt.Sprintf("%s:8080", ip), "taken")
	if err := d.SetEgress(ctx, "sbx-taken", ip, EgressPolicy{}); err != nil {
		t.Fatal(err)
	}
	hp := cfg.PortMin + 3
	if err := d.AddMapping(ctx, Mapping{Owner: "sbx-taken", HostPort: hp, SandboxIP: ip, GuestPort: 8080}); err != nil {
		t.Fatal(err)
	}
	mustTalk(t, "", d.DialAddr(hp), "taken")

	if _, err := d.Rename(ctx, "pool-gone", "sbx-x", ip); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("rename of a missing slot: %v", err)
	}
	if _, err := d.Attach(ctx, "pool-slot2", cfg.NodeCIDR.Addr().Next().Next().Next()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Rename(ctx, "pool-slot2", "sbx-taken", ip); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("rename onto a taken owner: %v", err)
	}
	for _, o := range []string{"sbx-taken", "pool-slot2"} {
		if err := d.Detach(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
}
