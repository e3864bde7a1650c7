package cubelet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
)

func createReq(id string) CreateRequest {
	return CreateRequest{SandboxID: id, Template: "tiny", EnvdAccessToken: "tok", AllowInternet: true}
}

// envdHealthy reports whether envd of sandbox id answers /health through
// its host-port mapping.
func envdHealthy(t *testing.T, c *Cubelet, id string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr, err := c.SandboxAddr(ctx, id, EnvdPort)
	if err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("health: %s", resp.Status)
	}
	return nil
}

// assertClean fails if anything of the node's sandboxes other than `live`
// remains: records, state dirs, mappings, endpoints, cgroups.
func assertClean(t *testing.T, c *Cubelet, live ...string) {
	t.Helper()
	left, err := leftovers(c, live...)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		t.Error(l)
	}
}

// leftovers lists what remains of the node's sandboxes other than `live`
// (and warm-pool slots): records, state dirs, mappings, endpoints, cgroups.
func leftovers(c *Cubelet, live ...string) ([]string, error) {
	ctx := context.Background()
	want := map[string]bool{}
	for _, id := range live {
		want[id] = true
	}
	// Kernel state first, records second: the refill loop may be making a
	// slot right now, and its record is written before its endpoint, state
	// dir and cgroup, so every one seen here has its record in the listing
	// below.
	maps, err := c.dp.Mappings(ctx)
	if err != nil {
		return nil, err
	}
	eps, err := c.dp.Endpoints(ctx)
	if err != nil {
		return nil, err
	}
	dirs := c.stateDirIDs()
	ids, _ := cgroup.List(c.cfg.CgroupParent)
	recs, bad := c.store.List()
	for _, r := range recs {
		if r.State == nodestore.StatePooled {
			// A warm-pool slot (ready, or being made by the refill loop
			// right now) is owned by the pool through its record.
			want[r.ID] = true
		}
	}
	// Runtime objects are named by the record's runtime (a slot's id for
	// a sandbox made from a slot).
	var left []string
	wantRT := map[string]bool{}
	for _, r := range recs {
		if !want[r.ID] {
			left = append(left, fmt.Sprintf("leftover record %s (%s)", r.ID, r.State))
			continue
		}
		wantRT[r.Runtime()] = true
	}
	if len(bad) > 0 {
		left = append(left, fmt.Sprintf("bad records: %v", bad))
	}
	for _, id := range dirs {
		if !wantRT[id] {
			left = append(left, "leftover state dir "+id)
		}
	}
	for _, m := range maps {
		if !wantRT[m.Owner] {
			left = append(left, fmt.Sprintf("leftover mapping %+v", m))
		}
	}
	dying := map[string]bool{}
	for _, ep := range eps {
		switch {
		case wantRT[ep.Owner]:
		case ep.NetNSPath == "" && ep.LinkName != "":
			dying[ep.Owner] = true
		default:
			left = append(left, fmt.Sprintf("leftover endpoint %+v", ep))
		}
	}
	for _, id := range ids {
		if validID(id) && !wantRT[id] {
			left = append(left, "leftover cgroup "+id)
		}
	}
	stuck, err := linksThatStay(ctx, c, dying)
	for _, ep := range stuck {
		left = append(left, fmt.Sprintf("leftover endpoint (its netns was released, its link stayed) %+v", ep))
	}
	return left, err
}

// linksThatStay waits up to 5 s for the links of owners whose netns was
// unpinned: the kernel destroys a released netns, and the veth pair in it,
// after the kill returns (cubevs.Dataplane.Detach). It returns the
// endpoints of owners still there after that: a netns something keeps alive.
func linksThatStay(ctx context.Context, c *Cubelet, owners map[string]bool) ([]cubevs.Endpoint, error) {
	deadline := time.Now().Add(5 * time.Second)
	for len(owners) > 0 {
		eps, err := c.dp.Endpoints(ctx)
		if err != nil {
			return nil, err
		}
		var stay []cubevs.Endpoint
		for _, ep := range eps {
			if owners[ep.Owner] {
				stay = append(stay, ep)
			}
		}
		if len(stay) == 0 || time.Now().After(deadline) {
			return stay, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, nil
}

func TestCreateReachKill(t *testing.T) {
	n := newTestNode(t)
	c := n.start(t)
	defer c.Close()
	ctx := context.Background()

	sb, err := c.CreateSandbox(ctx, createReq("sbx-one"))
	if err != nil {
		t.Fatal(err)
	}
	if sb.CPUCount != 2 || sb.MemoryMB != 512 || !n.cfg.Network.NodeCIDR.Contains(sb.IP) {
		t.Fatalf("sandbox %+v", sb)
	}
	if err := envdHealthy(t, c, sb.ID); err != nil {
		t.Fatalf("envd unreachable: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, createReq("sbx-one")); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, CreateRequest{SandboxID: "x", Template: "nope"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown template: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, CreateRequest{SandboxID: "../evil", Template: "tiny"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad id: %v", err)
	}
	m, err := c.SandboxMetrics(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if m.MemUsed <= 0 || m.MemTotal != 512<<20 {
		t.Fatalf("metrics %+v", m)
	}
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.KillSandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second kill: %v", err)
	}
	assertClean(t, c)
}

func TestRestartReadoptsAndRepairs(t *testing.T) {
	n := newTestNode(t)
	c := n.start(t)
	ctx := context.Background()
	ids := []string{"keep-a", "keep-b", "keep-c"}
	for _, id := range ids {
		if _, err := c.CreateSandbox(ctx, createReq(id)); err != nil {
			t.Fatal(err)
		}
	}
	// Lose one mapping in the kernel while the agent is down.
	rec, _ := c.store.Get("keep-b")
	if err := c.dp.RemoveMapping(ctx, rec.Ports[EnvdPort]); err != nil {
		t.Fatal(err)
	}
	c.Close()

	c = n.start(t)
	defer c.Close()
	for _, id := range ids {
		if err := envdHealthy(t, c, id); err != nil {
			t.Errorf("%s after restart: %v", id, err)
		}
	}
	assertClean(t, c, ids...)
}

func TestLostStoreRebuildsAndSweepsOrphans(t *testing.T) {
	n := newTestNode(t)
	c := n.start(t)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, createReq("survivor")); err != nil {
		t.Fatal(err)
	}
	// An orphan mapping whose owner never existed (the seed bug: a stale
	// entry blocking the next create on the same port).
	if err := c.dp.AddMapping(ctx, cubevs.Mapping{Owner: "ghost", HostPort: n.cfg.Network.PortMin + 10,
		SandboxIP: n.cfg.Network.NodeCIDR.Addr().Next().Next().Next().Next(), GuestPort: EnvdPort}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := os.Remove(filepath.Join(n.cfg.StateDir, "node.db")); err != nil {
		t.Fatal(err)
	}
	c = n.start(t)
	defer c.Close()
	if err := envdHealthy(t, c, "survivor"); err != nil {
		t.Fatalf("survivor after store loss: %v", err)
	}
	assertClean(t, c, "survivor")
	// New creates succeed at once, including on every remaining port.
	if _, err := c.CreateSandbox(ctx, createReq("newcomer")); err != nil {
		t.Fatal(err)
	}
	if err := envdHealthy(t, c, "newcomer"); err != nil {
		t.Fatal(err)
	}
}

// TestWarmPool creates sandboxes from pre-provisioned slots: the sandbox
// keeps the slot's IP and network (named by the slot), the pool refills,
// and nothing of a slot is left behind after a kill or a restart.
func TestWarmPool(t *testing.T) {
	for _, prestart := range []bool{true, false} {
		t.Run(fmt.Sprintf("prestart=%v", prestart), func(t *testing.T) { warmPool(t, prestart) })
	}
}

func warmPool(t *testing.T, prestart bool) {
	n := newTestNode(t)
	n.cfg.PoolSize, n.cfg.PoolPrestart = 2, prestart
	c := n.start(t)
	ctx := context.Background()
	waitPool := func(want int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for c.PoolSize() < want {
			if time.Now().After(deadline) {
				t.Fatalf("pool has %d slots, want %d", c.PoolSize(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitPool(2)
	slotIPs := map[string]bool{}
	recs, _ := c.store.List()
	for _, r := range recs {
		slotIPs[r.IP.String()] = true
	}
	sb, err := c.CreateSandbox(ctx, createReq("from-pool"))
	if err != nil {
		t.Fatal(err)
	}
	if !slotIPs[sb.IP.String()] {
		t.Fatalf("sandbox IP %s did not come from a slot %v", sb.IP, slotIPs)
	}
	if err := envdHealthy(t, c, sb.ID); err != nil {
		t.Fatal(err)
	}
	// The endpoint is owned by the record's runtime name: the slot's id,
	// which it keeps for life.
	rec, err := c.store.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !isSlot(rec.Runtime()) {
		t.Fatalf("record %+v: runtime not named by the slot", rec)
	}
	eps, _ := c.dp.Endpoints(ctx)
	found := false
	for _, ep := range eps {
		found = found || (ep.Owner == rec.Runtime() && ep.IP == sb.IP)
	}
	if !found {
		t.Fatalf("no endpoint of %s (runtime %s) with IP %s: %+v", sb.ID, rec.Runtime(), sb.IP, eps)
	}
	waitPool(2)
	assertClean(t, c, sb.ID)
	// Doctor agrees: slots and sandbox are owned (a plain slot's state dir
	// holds only its disk image, and no shim runs for it).
	if in, err := Inspect(ctx, n.cfg); err != nil || in.Problems() != 0 {
		t.Fatalf("inspect: %+v, %v", in, err)
	}
	// A restart keeps the slots and the sandbox.
	c.Close()
	c = n.start(t)
	if c.PoolSize() != 2 {
		t.Fatalf("pool after restart: %d", c.PoolSize())
	}
	if err := envdHealthy(t, c, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	assertClean(t, c)
	if err := c.DestroyNetwork(ctx); err != nil {
		t.Fatal(err)
	}
	if recs, _ := c.store.List(); len(recs) != 0 {
		t.Fatalf("records left after DestroyNetwork: %+v", recs)
	}
}

// TestDeadSandboxIsReapedAndReported: a sandbox whose supervisor dies while
// the cubelet runs is removed and reported, not silently kept.
func TestDeadSandboxIsReapedAndReported(t *testing.T) {
	n := newTestNode(t)
	reported := make(chan string, 1)
	n.cfg.OnDead = func(id string) { reported <- id }
	n.cfg.MaintainInterval = 100 * time.Millisecond
	c := n.start(t)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, createReq("doomed")); err != nil {
		t.Fatal(err)
	}
	sb, err := nsrt.Attach(ctx, c.sandboxDir("doomed"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(sb.ShimPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sb.Close()
	select {
	case id := <-reported:
		if id != "doomed" {
			t.Fatalf("reported %s", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("dead sandbox not reaped")
	}
	assertClean(t, c)
}

// TestCleanupForUninstall: `cube node cleanup` kills every sandbox, drops the
// pool and removes the dataplane, cgroups and state; it refuses while a
// cubelet runs.
func TestCleanupForUninstall(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 2
	c := n.start(t)
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, createReq("leftover")); err != nil {
		t.Fatal(err)
	}
	// The pool refills after the create took a slot: wait for both slots
	// to be ready (a slot still being made is undone by Close), which
	// cleanup must report apart from the sandbox.
	var slots []string
	deadline := time.Now().Add(60 * time.Second)
	for len(slots) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d slots after 60s, want 2", len(slots))
		}
		time.Sleep(100 * time.Millisecond)
		recs, _ := c.store.List()
		slots = slots[:0]
		for _, r := range recs {
			if r.State == nodestore.StatePooled && c.isReady(r.ID) { // made, not being made
				slots = append(slots, r.ID)
			}
		}
	}
	if _, err := Cleanup(ctx, n.cfg, true); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("cleanup while the cubelet runs: %v", err)
	}
	c.Close()
	rep, err := Cleanup(ctx, n.cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(slots)
	slices.Sort(rep.PoolSlots)
	if !slices.Equal(rep.Sandboxes, []string{"leftover"}) || !slices.Equal(rep.PoolSlots, slots) || !rep.Dataplane || !rep.StateDir {
		t.Fatalf("report %+v, want sandbox leftover and pool slots %v apart", rep, slots)
	}
	if _, err := os.Stat(n.cfg.StateDir); !os.IsNotExist(err) {
		t.Fatalf("state dir left: %v", err)
	}
	if _, err := cubevs.OpenExisting(ctx, n.cfg.Network); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("dataplane left: %v", err)
	}
	if ids, _ := cgroup.List(n.cfg.CgroupParent); len(ids) != 0 {
		t.Fatalf("cgroups left: %v", ids)
	}
}

// startWithOneSandbox starts a cubelet without a pool and creates sandbox
// id on it (n.start closes the cubelet when the test ends).
func startWithOneSandbox(t *testing.T, id string) (*Cubelet, nodestore.Sandbox) {
	t.Helper()
	n := newTestNode(t)
	n.cfg.PoolSize = 0
	c := n.start(t)
	if _, err := c.CreateSandbox(context.Background(), createReq(id)); err != nil {
		t.Fatal(err)
	}
	rec, err := c.store.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

// A kill answers once the sandbox's processes are gone and everything it
// owned is released; a second kill finds nothing.
func TestKillLeavesNothing(t *testing.T) {
	c, rec := startWithOneSandbox(t, "bg-kill")
	ctx := context.Background()
	sb, err := nsrt.Attach(ctx, c.sandboxDir(rec.Runtime()))
	if err != nil {
		t.Fatal(err)
	}
	shimPID, initPID := sb.ShimPID(), sb.InitPID()
	sb.Close()
	if err := c.KillSandbox(ctx, "bg-kill"); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{shimPID, initPID} {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("process %d still there when the kill returned", pid)
		}
	}
	if err := c.KillSandbox(ctx, "bg-kill"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second kill: %v, want ErrNotFound", err)
	}
	assertClean(t, c)
}

// A sandbox left "deleting" (a kill that failed part-way: the processes are
// gone, a release step failed) is finished by the maintain loop's retry
// instead of waiting for the next restart.
func TestFinishDeletesRetriesFailedReleases(t *testing.T) {
	c, rec := startWithOneSandbox(t, "half-gone")
	ctx := context.Background()
	// What a kill whose release failed leaves: a deleting record, the
	// processes gone, everything else still there.
	if killErr, err := c.stop(ctx, rec); err != nil || killErr != nil {
		t.Fatal(err, killErr)
	}
	if got, err := c.store.Get("half-gone"); err != nil || got.State != nodestore.StateDeleting {
		t.Fatalf("record = %+v, %v; want deleting", got, err)
	}
	c.finishDeletes(ctx)
	assertClean(t, c)
}
