package integration

import (
	"context"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
)

// createWithTickers creates count sandboxes and starts the ticker in each.
func (n *node) createWithTickers(ctx context.Context, count int) []*sandbox {
	n.t.Helper()
	sbs := make([]*sandbox, count)
	var wg sync.WaitGroup
	errs := make([]error, count)
	sem := make(chan struct{}, 4)
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := n.create(ctx)
			if err == nil {
				err = n.startTicker(ctx, sb)
			}
			sbs[i], errs[i] = sb, err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			n.t.Fatalf("sandbox %d: %v", i, err)
		}
	}
	return sbs
}

// assertServing checks every sandbox answers a command through the proxy
// and its ticker advanced (it ran on while the agent was gone).
func (n *node) assertServing(ctx context.Context, sbs []*sandbox) {
	n.t.Helper()
	var wg sync.WaitGroup
	for _, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			before := sb.lastTick
			if err := n.tickerProgress(ctx, sb); err != nil {
				n.t.Errorf("sandbox %s: long-running command: %v", sb.ID, err)
				return
			}
			if sb.lastTick <= before {
				n.t.Errorf("sandbox %s: ticker did not advance (%d)", sb.ID, sb.lastTick)
			}
			out, err := n.run(ctx, sb, "echo hello-$(hostname)")
			if err != nil || strings.TrimSpace(out) != "hello-"+sb.ID {
				n.t.Errorf("sandbox %s: command: %q %v", sb.ID, out, err)
			}
		}()
	}
	wg.Wait()
}

// assertMappings checks mapdump shows exactly the given owners, each with
// one owned mapping, and no orphan.
func (n *node) assertMappings(sbs []*sandbox) {
	n.t.Helper()
	doc, out := n.mapdump()
	by, owners := doc.statuses()
	if c := orphanLines(out); c != 0 || by["orphan"] != 0 || by["conflict"] != 0 {
		n.t.Errorf("mapdump: %d orphan lines, statuses %v\n%s", c, by, out)
	}
	if by["owned"] != len(sbs) {
		n.t.Errorf("mapdump: %d owned mappings, want %d\n%s", by["owned"], len(sbs), out)
	}
	for _, sb := range sbs {
		if owners[sb.ID] != 1 {
			n.t.Errorf("mapdump: sandbox %s has %d owned mappings", sb.ID, owners[sb.ID])
		}
	}
}

// TestRestartAfterSIGKILL is the restart test: 20 sandboxes with
// running commands, SIGKILL cube up, start it again.
func TestRestartAfterSIGKILL(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	first := n.start()
	t.Logf("first start to serving: %s", first)
	sbs := n.createWithTickers(ctx, 20)

	n.kill()
	restart := n.start()
	t.Logf("restart to serving with %d sandboxes: %s", len(sbs), restart)

	n.assertServing(ctx, sbs)
	n.assertMappings(sbs)
	sb, err := n.create(ctx)
	if err != nil {
		t.Fatalf("create after restart: %v", err)
	}
	if out, err := n.run(ctx, sb, "echo fresh"); err != nil || strings.TrimSpace(out) != "fresh" {
		t.Fatalf("new sandbox: %q %v", out, err)
	}
}

// TestLostStoreSeedBug reproduces the seed failure: the node store is lost
// while kernel state survives, and a stale mapping sits on the host port and
// the (sandbox address, guest port) the next create will use. The restarted
// cube must sweep it and create at once. It also exercises `cube node`
// mapdump, doctor and gc against a stopped node.
func TestLostStoreSeedBug(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	n.start()
	survivor := n.createWithTickers(ctx, 1)[0]
	if out, code := n.cubeCLI("node", "gc"); code == 0 || !strings.Contains(out, "running cubelet") {
		t.Fatalf("gc while cube runs: exit %d: %s", code, out)
	}
	n.kill()
	if err := os.Remove(filepath.Join(n.dataDir(), "node", "node.db")); err != nil {
		t.Fatal(err)
	}
	// The survivor holds the first address and port; the next create takes
	// the second of each. Plant a dead owner's state right there.
	ghostIP := n.net.NodeCIDR.Addr().Next().Next().Next()
	n.plantOrphans(ctx, "ghost-a", n.net.PortMin+1, ghostIP)

	doc, out := n.mapdump()
	if c := orphanLines(out); c != 1 || len(doc.Mappings) != 2 {
		t.Fatalf("mapdump before restart: want 1 orphan of 2 mappings, got %d\n%s", c, out)
	}
	if out, code := n.cubeCLI("node", "doctor"); code == 0 ||
		!strings.Contains(out, "endpoint "+filepath.Join(n.net.RunDir, "netns", "ghost-a")) ||
		!strings.Contains(out, "cgroup "+n.cgroup+"/ghost-a") {
		t.Fatalf("doctor on a dirty node: exit %d\n%s", code, out)
	}

	n.start()
	sb, err := n.create(ctx)
	if err != nil {
		t.Fatalf("create on the seed bug's port: %v", err)
	}
	n.assertServing(ctx, []*sandbox{survivor})
	if out, err := n.run(ctx, sb, "echo ok"); err != nil || strings.TrimSpace(out) != "ok" {
		t.Fatalf("new sandbox: %q %v", out, err)
	}
	n.assertMappings([]*sandbox{survivor, sb})

	// Offline repair with gc: a new orphan appears while cube is down.
	n.kill()
	n.plantOrphans(ctx, "ghost-b", n.net.PortMax, n.net.NodeCIDR.Addr().Next().Next().Next().Next().Next())
	out, code := n.cubeCLI("node", "gc")
	if code != 0 || orphanLines(out) < 3 {
		t.Fatalf("gc: exit %d\n%s", code, out)
	}
	n.assertMappings([]*sandbox{survivor, sb})
	if out, code := n.cubeCLI("node", "doctor"); code != 0 {
		t.Fatalf("doctor after gc: exit %d\n%s", code, out)
	}
	n.start()
	n.assertServing(ctx, []*sandbox{survivor})
}

// plantOrphans leaves, for a sandbox that does not exist, a mapping on
// hostPort to ip:49983, an endpoint (netns pin + veth) and a cgroup.
func (n *node) plantOrphans(ctx context.Context, owner string, hostPort uint16, ip netip.Addr) {
	n.t.Helper()
	dp, err := cubevs.Open(ctx, n.cubeletConfig().Network)
	if err != nil {
		n.t.Fatal(err)
	}
	defer dp.Close()
	if _, err := dp.Attach(ctx, owner, ip); err != nil {
		n.t.Fatal(err)
	}
	if err := dp.AddMapping(ctx, cubevs.Mapping{Owner: owner, HostPort: hostPort, SandboxIP: ip, GuestPort: 49983}); err != nil {
		n.t.Fatal(err)
	}
	cg, err := cgroup.Open(n.cgroup, owner)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := cg.Create(cgroup.Resources{}); err != nil {
		n.t.Fatal(err)
	}
}

// TestInPlaceUpgrade replaces the cube binary while a sandbox runs a
// command: stop the old binary gracefully (keeping sandboxes), delete it,
// start the new one from another path.
func TestInPlaceUpgrade(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	oldBin := copyBinary(t, bins.cube, filepath.Join(n.dir, "v1", "cube"))
	newBin := copyBinary(t, bins.cube, filepath.Join(n.dir, "v2", "cube"))
	n.exe = oldBin
	n.extra = []string{"--keep-sandboxes"}
	n.start()
	sbs := n.createWithTickers(ctx, 2)

	n.stop()
	if err := os.RemoveAll(filepath.Dir(oldBin)); err != nil {
		t.Fatal(err)
	}
	n.exe, n.extra = newBin, nil
	took := n.start()
	t.Logf("upgrade restart to serving: %s", took)
	n.assertServing(ctx, sbs)
	n.assertMappings(sbs)
	if _, err := n.create(ctx); err != nil {
		t.Fatalf("create after upgrade: %v", err)
	}
}

func copyBinary(t *testing.T, src, dst string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}
