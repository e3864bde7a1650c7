package cubelet

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
)

func TestClassifyMapping(t *testing.T) {
	ip := netip.MustParseAddr("172.16.0.2")
	rec := nodestore.Sandbox{ID: "a", IP: ip, Ports: map[uint16]uint16{EnvdPort: 20000}}
	recs := map[string]nodestore.Sandbox{"a": rec}
	m := cubevs.Mapping{Owner: "a", HostPort: 20000, SandboxIP: ip, GuestPort: EnvdPort}
	for _, tc := range []struct {
		name string
		m    cubevs.Mapping
		recs map[string]nodestore.Sandbox
		live map[string]bool
		want string
	}{
		{"owned", m, recs, map[string]bool{"a": true}, StatusOwned},
		{"no record, no shim", m, nil, nil, StatusOrphan},
		{"record, dead shim", m, recs, nil, StatusOrphan},
		{"live, being created", m, nil, map[string]bool{"a": true}, StatusOwned},
		{"other host port", cubevs.Mapping{Owner: "a", HostPort: 20001, SandboxIP: ip, GuestPort: EnvdPort}, recs, map[string]bool{"a": true}, StatusConflict},
		{"unrecorded guest port", cubevs.Mapping{Owner: "a", HostPort: 20000, SandboxIP: ip, GuestPort: 80}, recs, map[string]bool{"a": true}, StatusConflict},
		{"other ip", cubevs.Mapping{Owner: "a", HostPort: 20000, SandboxIP: ip.Next(), GuestPort: EnvdPort}, recs, map[string]bool{"a": true}, StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := classifyMapping(tc.m, tc.recs, tc.live)
			if got.Status != tc.want {
				t.Fatalf("status %q (%s), want %q", got.Status, got.Detail, tc.want)
			}
			if strings.Contains(strings.ToLower(got.Detail), "orphan") {
				t.Fatalf("detail %q says orphan: only the status may", got.Detail)
			}
		})
	}
}

// TestInspectAndGC plants orphans of every kind next to a live sandbox and
// checks Inspect names them (without changing anything), StoreLocked and
// GC's refusal while a cubelet runs, and that GC removes exactly them.
func TestInspectAndGC(t *testing.T) {
	n := newTestNode(t)
	ctx := context.Background()
	c := n.start(t)
	if _, err := c.CreateSandbox(ctx, createReq("live-one")); err != nil {
		t.Fatal(err)
	}
	if locked, err := StoreLocked(n.cfg.storePath()); err != nil || !locked {
		t.Fatalf("store locked = %v, %v while the cubelet runs", locked, err)
	}
	if _, err := GC(ctx, n.cfg); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("GC while a cubelet runs: %v", err)
	}
	in, err := Inspect(ctx, n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if in.Source != SourceStateDirs || len(in.Mappings) != 1 || in.Mappings[0].Status != StatusOwned || in.Problems() != 0 {
		t.Fatalf("inspect of a clean running node: %+v", in)
	}
	ghostIP := n.cfg.Network.NodeCIDR.Addr().Next().Next().Next().Next()
	if _, err := c.dp.Attach(ctx, "ghost", ghostIP); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.AddMapping(ctx, cubevs.Mapping{Owner: "ghost", HostPort: n.cfg.Network.PortMax, SandboxIP: ghostIP, GuestPort: EnvdPort}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(n.cfg.sandboxesDir(), "ghost"), 0o700); err != nil {
		t.Fatal(err)
	}
	c.Close()

	in, err = Inspect(ctx, n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if in.Source != SourceStore {
		t.Fatalf("source %s with the store free", in.Source)
	}
	kinds := map[string]int{}
	for _, f := range in.Findings {
		kinds[f.Kind+"/"+f.Status]++
	}
	statuses := map[string]int{}
	for _, m := range in.Mappings {
		statuses[m.Status]++
	}
	if statuses[StatusOwned] != 1 || statuses[StatusOrphan] != 1 ||
		kinds[FindingEndpoint+"/"+StatusOrphan] != 1 || kinds[FindingStateDir+"/"+StatusOrphan] != 1 || in.Problems() != 3 {
		t.Fatalf("inspect: mappings %v findings %v (%+v)", statuses, kinds, in.Findings)
	}
	rep, err := GC(ctx, n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Orphans) != 3 || len(rep.Adopted) != 1 {
		t.Fatalf("gc report %+v", rep)
	}
	if in, err = Inspect(ctx, n.cfg); err != nil || in.Problems() != 0 || len(in.Live) != 1 {
		t.Fatalf("after gc: %+v %v", in, err)
	}
	c = n.start(t)
	defer c.Close()
	if err := envdHealthy(t, c, "live-one"); err != nil {
		t.Fatalf("live sandbox after gc: %v", err)
	}
	assertClean(t, c, "live-one")
}
