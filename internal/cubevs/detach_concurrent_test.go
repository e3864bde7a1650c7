package cubevs

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
)

// Concurrent Detach calls (a burst's kills): every detached owner's link,
// peer and pin are gone, the owners left keep theirs, and a detached name
// and address can be attached again at once.
func TestConcurrentDetachDeletesEveryLink(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	const n, keep = 12, 2
	ips := map[string]netip.Addr{}
	ip := cfg.NodeCIDR.Addr().Next()
	for i := range n {
		ip = ip.Next()
		o := fmt.Sprintf("sbx-reap-%02d", i)
		ips[o] = ip
		if _, err := d.Attach(ctx, o, ip); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, n-keep)
	for i := range n - keep {
		wg.Go(func() { errs[i] = d.Detach(ctx, fmt.Sprintf("sbx-reap-%02d", i)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Detach sbx-reap-%02d: %v", i, err)
		}
	}
	eps, err := d.Endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, ep := range eps {
		left = append(left, ep.Owner)
		if ep.LinkName == "" || ep.NetNSPath == "" {
			t.Errorf("kept owner %s lost part of its endpoint: %+v", ep.Owner, ep)
		}
	}
	slices.Sort(left)
	if fmt.Sprint(left) != "[sbx-reap-10 sbx-reap-11]" {
		t.Errorf("endpoints after the detaches: %v, want the two kept", left)
	}
	// The names and addresses are free at once.
	for i := range 2 {
		o := fmt.Sprintf("sbx-reap-%02d", i)
		if _, err := d.Attach(ctx, o, ips[o]); err != nil {
			t.Fatalf("re-attach %s: %v", o, err)
		}
	}
	// Detaching a gone owner is fine.
	if err := d.Detach(ctx, "sbx-reap-05"); err != nil {
		t.Fatal(err)
	}
}
