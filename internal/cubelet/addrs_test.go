package cubelet

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
)

// The free sets follow the owner records of a real node store: rebuilt
// from them at open, changed by every committed write, and a slot handed
// to a sandbox keeps its IP held throughout. No root needed.
func TestAddrsFollowRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	store, err := nodestore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	net := cubevs.Config{NodeCIDR: netip.MustParsePrefix("10.77.0.0/29"), PortMin: 31000, PortMax: 31002} // IPs .2-.6
	ip := func(s string) netip.Addr { return netip.MustParseAddr("10.77.0." + s) }
	for _, r := range []nodestore.Sandbox{
		{ID: "a", State: nodestore.StateRunning, IP: ip("2"), Ports: map[uint16]uint16{EnvdPort: 31000}},
		{ID: "pool-1", State: nodestore.StatePooled, IP: ip("4")},
	} {
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()

	// A restart: the sets are rebuilt from the records.
	store, err = nodestore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c := &Cubelet{store: store, addrs: newAddrs(net, store), reconciled: true}
	ctx := context.Background()
	gotIP, port, release, err := c.allocate(ctx, nodestore.Sandbox{})
	if err != nil || gotIP != ip("3") || port != 31001 {
		t.Fatalf("allocate after restart = %v %d %v, want 10.77.0.3 31001 (10.77.0.2, 31000, .4 are recorded)", gotIP, port, err)
	}
	// The create writes its record, then drops its reservation.
	if err := store.Put(nodestore.Sandbox{ID: "b", State: nodestore.StateCreating, IP: gotIP, Ports: map[uint16]uint16{EnvdPort: port}}); err != nil {
		t.Fatal(err)
	}
	release()
	if !c.addrs.IPHeld(gotIP) || !c.addrs.PortHeld(port) {
		t.Fatal("record's addresses freed when the reservation was dropped")
	}

	// Taking the slot: the sandbox's record replaces the slot's, same IP.
	slot, _ := store.Get("pool-1")
	sip, sport, srelease, err := c.allocate(ctx, slot)
	if err != nil || sip != ip("4") || sport != 31002 {
		t.Fatalf("allocate from slot = %v %d %v", sip, sport, err)
	}
	if err := store.PutReplacing(nodestore.Sandbox{ID: "c", RuntimeID: "pool-1", State: nodestore.StateCreating, IP: sip,
		Ports: map[uint16]uint16{EnvdPort: sport}}, "pool-1"); err != nil {
		t.Fatal(err)
	}
	srelease()
	if !c.addrs.IPHeld(sip) {
		t.Fatal("slot IP freed when its record was replaced by the sandbox's")
	}

	// Ports exhausted: the error names the range and the flag.
	_, _, _, err = c.allocate(ctx, nodestore.Sandbox{})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "31000-31002") ||
		!strings.Contains(err.Error(), "--port-range") {
		t.Fatalf("allocate with every port taken: %v", err)
	}
	if c.addrs.IPHeld(ip("5")) {
		t.Fatal("a failed allocate kept its IP")
	}

	// Deleting a record frees its addresses: the port for the next create,
	// the IP when the allocator comes round to it (next fit: after .5, which
	// the failed allocate took and gave back).
	if err := store.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if c.addrs.IPHeld(ip("2")) {
		t.Fatal("deleted record's IP still held")
	}
	gotIP, port, release, err = c.allocate(ctx, nodestore.Sandbox{})
	if err != nil || gotIP != ip("6") || port != 31000 {
		t.Fatalf("allocate after delete = %v %d %v, want 10.77.0.6 31000", gotIP, port, err)
	}
	release()

	// Stray ports (mapped without an owner) stay held until noted again.
	c.mu.Lock()
	c.holdStrayPorts(map[uint16]bool{31000: true})
	c.mu.Unlock()
	if _, err := c.takePort(ctx); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("stray port handed out: %v", err)
	}
	c.mu.Lock()
	c.holdStrayPorts(map[uint16]bool{})
	c.mu.Unlock()
	if p, err := c.takePort(ctx); err != nil || p != 31000 {
		t.Fatalf("after the stray went: %d %v", p, err)
	}
	if ips, ports := c.addrs.Used(); ips != 2 || ports != 3 {
		t.Fatalf("used %d IPs %d ports, want 2 (b, c) and 3 (b, c, the port just taken)", ips, ports)
	}
}
