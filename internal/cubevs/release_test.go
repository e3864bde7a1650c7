package cubevs

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Concurrent Release calls (a burst's kills): every released owner's pin is
// gone at once and its link and peer soon after (the kernel destroys them
// with the netns), the owners left keep theirs, and a released name and
// address can be attached again at once.
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
		wg.Go(func() { errs[i] = d.Release(ctx, fmt.Sprintf("sbx-reap-%02d", i), nil) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Release sbx-reap-%02d: %v", i, err)
		}
	}
	for i := range n - keep {
		if ok, _ := isPinned(cfg.sandboxPin(fmt.Sprintf("sbx-reap-%02d", i))); ok {
			t.Errorf("sbx-reap-%02d still pinned after Release", i)
		}
	}
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		eps, err := d.Endpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, ep := range eps {
			left = append(left, ep.Owner)
		}
		slices.Sort(left)
		if fmt.Sprint(left) == "[sbx-reap-10 sbx-reap-11]" {
			for _, ep := range eps {
				if ep.LinkName == "" || ep.NetNSPath == "" {
					t.Errorf("kept owner %s lost part of its endpoint: %+v", ep.Owner, ep)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoints 10 s after the detaches: %v, want the two kept", left)
		}
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

// A released owner's link stays while something keeps its netns alive (a
// process that outlived the kill; here an open fd). Its address, handed to
// another owner, is routed to that owner: Attach deletes the leftover link
// instead of failing the create. A live owner's address stays a conflict.
// Detach (a sweep) deletes the link even while its netns lives.
func TestAttachTakesAddressFromDetachedOwner(t *testing.T) {
	requireRoot(t)
	cfg := testConfig(t)
	ctx := ctxT(t)
	d := openDP(t, cfg)
	ip := cfg.NodeCIDR.Addr().Next().Next()
	if _, err := d.Attach(ctx, "sbx-gone", ip); err != nil {
		t.Fatal(err)
	}
	held, err := os.Open(cfg.sandboxPin("sbx-gone"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := d.Release(ctx, "sbx-gone", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := d.dp.LinkByName(LinkName("sbx-gone")); err != nil {
		t.Fatalf("the link of a netns still alive went at Release: %v", err)
	}
	if link, _, _ := d.routeOwner(ip); link != LinkName("sbx-gone") {
		t.Fatalf("route to %s names %q before the new attach", ip, link)
	}
	if _, err := d.Attach(ctx, "sbx-next", ip); err != nil {
		t.Fatalf("attach with the detached owner's address: %v", err)
	}
	if link, owner, _ := d.routeOwner(ip); link != LinkName("sbx-next") || owner != "sbx-next" {
		t.Fatalf("route to %s: link %q owner %q, want sbx-next's", ip, link, owner)
	}
	if _, err := d.dp.LinkByName(LinkName("sbx-gone")); err == nil {
		t.Fatal("the detached owner's link is still there")
	}
	// The new owner is reached at the address (through a host port).
	serveTag(t, cfg.sandboxPin("sbx-next"), "0.0.0.0:8080", "next")
	if err := d.AddMapping(ctx, Mapping{Owner: "sbx-next", HostPort: cfg.PortMin + 1, SandboxIP: ip, GuestPort: 8080}); err != nil {
		t.Fatal(err)
	}
	mustTalk(t, "", d.DialAddr(cfg.PortMin+1), "next")
	if _, err := d.Attach(ctx, "sbx-third", ip); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("attach with a live owner's address: %v, want ErrConflict", err)
	}
	if err := d.Release(ctx, "sbx-gone", nil); err != nil {
		t.Fatalf("release again: %v", err)
	}

	// Detach does not wait for the netns: the link goes now.
	if _, err := d.Attach(ctx, "sbx-swept", ip.Next()); err != nil {
		t.Fatal(err)
	}
	held2, err := os.Open(cfg.sandboxPin("sbx-swept"))
	if err != nil {
		t.Fatal(err)
	}
	defer held2.Close()
	if err := d.Detach(ctx, "sbx-swept"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.dp.LinkByName(LinkName("sbx-swept")); err == nil {
		t.Fatal("Detach left the link of a netns still alive")
	}
}
