package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/pgtest"
	"github.com/cube-dev/cube/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// replicas opens n registries, each with its own connection pool, on one
// fresh PostgreSQL database: n `cube server` replicas as the chart runs them.
func replicas(t *testing.T, n int, cfg Config) ([]*Registry, []store.Store) {
	t.Helper()
	dsn := pgtest.Shared(t).NewDatabase(t)
	rs, sts := make([]*Registry, n), make([]store.Store, n)
	for i := range rs {
		st, err := store.Open(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		c := cfg
		c.ServerVersion = "v0.5.0"
		rs[i], sts[i] = NewRegistry(c, DocumentNodes{Docs: st}, st), st
		rs[i].SetLifecycle(&lifecycleRecorder{st: st})
		if err := rs[i].Load(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return rs, sts
}

// tokenNode serves the real CubeletService handler (nodeapi, with its
// bearer-token check) on loopback. restart swaps in a new token, as a
// restarted cubelet does; onRefused runs when a call carries a wrong token.
type tokenNode struct {
	srv       *httptest.Server
	mu        sync.Mutex
	token     string
	handler   http.Handler
	onRefused func()
	created   []string
	paused    []string
	committed []nodeproto.CommitRequest
	deleted   []string
}

func newTokenNode(t *testing.T, token string) *tokenNode {
	n := &tokenNode{}
	n.restart(token)
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		n.mu.Lock()
		want, hook := n.token, n.onRefused
		n.mu.Unlock()
		if hook != nil && req.Header.Get("Authorization") != "Bearer "+want {
			hook()
		}
		n.mu.Lock()
		h := n.handler
		n.mu.Unlock()
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *tokenNode) restart(token string) {
	_, h := nodeapi.NewCubeletHandler(n, func(context.Context) (*nodev1.NodeInfo, error) {
		return &nodev1.NodeInfo{NodeId: "n1", Version: "v0.5.0"}, nil
	}, token)
	n.mu.Lock()
	n.token, n.handler = token, h
	n.mu.Unlock()
}

func (n *tokenNode) record(token string) NodeRecord {
	r := rec("n1", "v0.5.0")
	r.RPCURL, r.Token = n.srv.URL, token
	return r
}

func (n *tokenNode) CreateSandbox(_ context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.created = append(n.created, req.SandboxID)
	return nodeproto.Sandbox{ID: req.SandboxID, Template: req.Template, IP: netip.MustParseAddr("10.11.0.2"),
		CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, StartedAt: time.Now()}, nil
}
func (n *tokenNode) KillSandbox(context.Context, string) error { return nil }
func (n *tokenNode) HostPort(context.Context, string, uint16) (uint16, error) {
	return 0, errdefs.ErrNotImplemented
}
func (n *tokenNode) SandboxMetrics(context.Context, string) (nodeproto.Metrics, error) {
	return nodeproto.Metrics{}, errdefs.ErrNotImplemented
}
func (n *tokenNode) PauseSandbox(_ context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.paused = append(n.paused, id)
	return nil
}
func (n *tokenNode) ResumeSandbox(context.Context, string) error { return nil }
func (n *tokenNode) UpdateEgress(context.Context, string, nodeproto.EgressPolicy) error {
	return errdefs.ErrNotImplemented
}
func (n *tokenNode) Sandboxes(context.Context) ([]nodeproto.Sandbox, error) { return nil, nil }
func (n *tokenNode) CommitSandbox(_ context.Context, req nodeproto.CommitRequest) (nodeproto.Template, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.committed = append(n.committed, req)
	return nodeproto.Template{Name: req.Name, Digest: "sha256:c0", CPUCount: 1, MemoryMB: 256, DiskSizeMB: 1024}, nil
}
func (n *tokenNode) DeleteTemplate(_ context.Context, name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if name == "in-use" {
		return fmt.Errorf("template %q is in use: %w", name, errdefs.ErrFailedPrecondition)
	}
	n.deleted = append(n.deleted, name)
	return nil
}

// storeRunning records running sandboxes on node n1, as the master does
// after a create.
func storeRunning(t *testing.T, st store.Store, ids ...string) {
	t.Helper()
	now := time.Now()
	for _, id := range ids {
		if err := st.CreateSandbox(context.Background(), store.Sandbox{ID: id, TemplateID: "base", NodeID: "n1", StartedAt: now, EndAt: now.Add(time.Hour),
			State: store.StateRunning, CPUCount: 2, MemoryMB: 512, EnvdVersion: "0.5.7", EnvdAccessToken: "x"}); err != nil {
			t.Fatal(err)
		}
	}
}

// registeredOnBoth registers node (token t1) through a and syncs b, so both
// replicas know it.
func registeredOnBoth(t *testing.T, a, b *Registry, node *tokenNode) {
	t.Helper()
	ctx := context.Background()
	if err := a.Register(ctx, node.record("t1")); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func createReq(id string) nodeproto.CreateRequest {
	return nodeproto.CreateRequest{SandboxID: id, Template: "base", EnvdAccessToken: "x"}
}

// A cubelet that restarts re-registers with a new token through replica A;
// replica B, before its next Sync, must reach it with the new token.
func TestReRegistrationThroughOtherReplica(t *testing.T) {
	rs, sts := replicas(t, 2, Config{HeartbeatInterval: time.Hour})
	a, b := rs[0], rs[1]
	ctx := context.Background()
	node := newTokenNode(t, "t1")
	registeredOnBoth(t, a, b, node)
	if _, err := b.CreateSandbox(ctx, createReq("sb1")); err != nil {
		t.Fatalf("create with the first token: %v", err)
	}

	node.restart("t2")
	if err := a.Register(ctx, node.record("t2")); err != nil {
		t.Fatal(err)
	}
	sb, err := b.CreateSandbox(ctx, createReq("sb2"))
	if err != nil || sb.NodeID != "n1" {
		t.Fatalf("create through B after re-registration through A: %+v, %v", sb, err)
	}

	// Per-sandbox calls go the same way.
	storeRunning(t, sts[0], "sb2")
	node.restart("t3")
	if err := a.Register(ctx, node.record("t3")); err != nil {
		t.Fatal(err)
	}
	if err := b.PauseSandbox(ctx, "sb2"); err != nil {
		t.Fatalf("pause through B after re-registration through A: %v", err)
	}
	node.mu.Lock()
	created, paused := strings.Join(node.created, ","), strings.Join(node.paused, ",")
	node.mu.Unlock()
	if created != "sb1,sb2" || paused != "sb2" {
		t.Fatalf("node saw creates %q, pauses %q", created, paused)
	}

	// A token that is wrong in the store too is still refused: one retry,
	// no loop, and the error says why. It is Unavailable, not
	// Unauthenticated: the API must not answer 401 (the SDK would blame the
	// user's API key) for a node that has not registered again yet (found on
	// the real cluster after a re-install: the server loaded the node's old
	// record from the database).
	node.restart("t4")
	if _, err := b.CreateSandbox(ctx, createReq("sb3")); !errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrUnauthenticated) ||
		!strings.Contains(err.Error(), "missing or wrong node token") {
		t.Fatalf("create with a token no replica knows: %v", err)
	}
}

// The leader's probe of a late node must not call it Down because the
// cubelet re-registered (new token) through another replica while the
// probe was on its way.
func TestProbeRereadsStaleToken(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	rs, _ := replicas(t, 2, Config{HeartbeatInterval: time.Hour, DownAfter: 100 * time.Millisecond, ProbeTimeout: 2 * time.Second, Clock: clk})
	a, leader := rs[0], rs[1]
	ctx := context.Background()
	node := newTokenNode(t, "t1")
	if err := a.Register(ctx, node.record("t1")); err != nil {
		t.Fatal(err)
	}
	if err := leader.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(clk.Now().Add(300 * time.Millisecond)) // heartbeats missed: the leader probes
	// The cubelet restarts with a new token; the leader's probe, with the
	// old one, reaches it just before it registers through A.
	node.restart("t2")
	var once sync.Once
	node.mu.Lock()
	node.onRefused = func() {
		once.Do(func() {
			if err := a.Register(ctx, node.record("t2")); err != nil {
				t.Error(err)
			}
		})
	}
	node.mu.Unlock()
	leader.checkHealth(ctx)
	node.mu.Lock()
	node.onRefused = nil
	node.mu.Unlock()
	st, err := leader.Node("n1")
	if err != nil || st.State != StateReady {
		t.Fatalf("after probing a re-registered node: %+v, %v", st, err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := a.Node("n1"); st.State != StateReady {
		t.Fatalf("stored state after the probe: %+v", st)
	}

	// A node that really refuses its stored token is judged as before.
	node.restart("t9")
	clk.SetTime(clk.Now().Add(300 * time.Millisecond))
	leader.checkHealth(ctx)
	if st, _ := leader.Node("n1"); st.State != StateDown || !strings.Contains(st.Reason, "missing or wrong node token") {
		t.Fatalf("node refusing its stored token: %+v", st)
	}
}

// Isolate, drain and uncordon through replica A take effect on scheduling
// through replica B at once, not at B's next Sync.
func TestOperatorStateSharedForScheduling(t *testing.T) {
	rs, _ := replicas(t, 2, Config{HeartbeatInterval: time.Hour})
	a, b := rs[0], rs[1]
	ctx := context.Background()
	node := newTokenNode(t, "t1")
	registeredOnBoth(t, a, b, node)
	if err := a.Isolate(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSandbox(ctx, createReq("sb1")); !errors.Is(err, errdefs.ErrResourceExhausted) ||
		!strings.Contains(err.Error(), "n1: node is Isolated") {
		t.Fatalf("create through B onto a node isolated through A: %v", err)
	}
	if err := a.Uncordon(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSandbox(ctx, createReq("sb2")); err != nil {
		t.Fatalf("create through B after uncordon through A: %v", err)
	}
	if err := a.Drain(ctx, "n1", Drain{Policy: DrainWait, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateSandbox(ctx, createReq("sb3")); !errors.Is(err, errdefs.ErrResourceExhausted) ||
		!strings.Contains(err.Error(), "n1: node is Draining") {
		t.Fatalf("create through B onto a node drained through A: %v", err)
	}
	node.mu.Lock()
	created := strings.Join(node.created, ",")
	node.mu.Unlock()
	if created != "sb2" {
		t.Fatalf("node saw creates %q, want sb2 only", created)
	}
	// An operator action through B on a node B has not synced yet.
	node2 := newTokenNode(t, "u1")
	r2 := node2.record("u1")
	r2.ID = "n2"
	if err := a.Register(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if err := b.Isolate(ctx, "n2"); err != nil {
		t.Fatalf("isolate through B a node registered through A: %v", err)
	}
}

// A drain driven by the leader (A) reports the same phase and progress
// through every replica's GET /nodes, and a new drain never shows the
// previous one's progress.
func TestDrainProgressSharedByReplicas(t *testing.T) {
	rs, sts := replicas(t, 2, Config{HeartbeatInterval: time.Hour})
	leader, b := rs[0], rs[1]
	ctx := context.Background()
	node := newTokenNode(t, "t1")
	if err := leader.Register(ctx, node.record("t1")); err != nil {
		t.Fatal(err)
	}
	storeRunning(t, sts[0], "sb1", "sb2")
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	key, err := sts[1].CreateKey(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(NewAdminHandler(b, sts[1]))
	t.Cleanup(api.Close)
	drainOf := func() DrainState {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"/nodes", nil)
		req.Header.Set("X-API-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var ns []NodeStatus
		if err := json.NewDecoder(res.Body).Decode(&ns); err != nil || len(ns) != 1 || ns[0].Drain == nil {
			t.Fatalf("GET /nodes through B: %+v, %v (status %d)", ns, err, res.StatusCode)
		}
		return *ns[0].Drain
	}

	if err := leader.Drain(ctx, "n1", Drain{Policy: DrainKill, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if d := drainOf(); d.Phase != "grace" || d.Remaining != 2 {
		t.Fatalf("through B during grace: %+v", d)
	}
	// Policy wait with no deadline: the leader waits for the TTLs.
	if err := leader.Uncordon(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := leader.Drain(ctx, "n1", Drain{Policy: DrainWait}); err != nil {
		t.Fatal(err)
	}
	leader.driveDrains(ctx)
	if d := drainOf(); d.Phase != "waiting" || d.Remaining != 2 {
		t.Fatalf("through B while waiting: %+v", d)
	}
	// One sandbox ends (its TTL): the leader's count reaches B.
	if err := sts[0].DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	leader.driveDrains(ctx)
	if d := drainOf(); d.Phase != "waiting" || d.Remaining != 1 {
		t.Fatalf("through B after one sandbox ended: %+v", d)
	}
	if err := sts[0].DeleteSandbox(ctx, "sb2"); err != nil {
		t.Fatal(err)
	}
	leader.driveDrains(ctx)
	if d := drainOf(); d.Phase != "done" || d.Remaining != 0 {
		t.Fatalf("through B after the drain finished: %+v", d)
	}
	if st, _ := leader.Node("n1"); st.Drain == nil || st.Drain.Phase != "done" {
		t.Fatalf("on the leader: %+v", st.Drain)
	}
	// A new drain (after uncordon) starts from its own grace, not "done".
	if err := b.Uncordon(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Drain(ctx, "n1", Drain{Policy: DrainKill, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := leader.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := leader.Node("n1"); st.Drain == nil || st.Drain.Phase != "grace" {
		t.Fatalf("new drain on the leader: %+v", st.Drain)
	}
	if d := drainOf(); d.Phase != "grace" {
		t.Fatalf("new drain through B: %+v", d)
	}
}

// A node that moves (its new Pod has another address: a change of
// cubeNode.hostNetwork) and registers through replica A is reached by
// replica B at the new address before B's next Sync: found on the real
// cluster, where the first sandbox after a flip was unreachable through the
// replica that still dialled the old Pod IP.
func TestMovedNodeReachedThroughOtherReplica(t *testing.T) {
	rs, sts := replicas(t, 2, Config{HeartbeatInterval: time.Hour})
	a, b := rs[0], rs[1]
	ctx := context.Background()
	old := newTokenNode(t, "t1")
	registeredOnBoth(t, a, b, old)
	storeRunning(t, sts[0], "sb1")
	moved := newTokenNode(t, "t2")
	old.srv.Close() // the old Pod is gone: its address refuses connections
	if err := a.Register(ctx, moved.record("t2")); err != nil {
		t.Fatal(err)
	}
	// A per-sandbox call (as the proxy's and the API's are): no re-read of
	// the node records before it, only after the old address failed.
	if err := b.PauseSandbox(ctx, "sb1"); err != nil {
		t.Fatalf("pause through B after the node moved (registered through A): %v", err)
	}
	moved.mu.Lock()
	paused := strings.Join(moved.paused, ",")
	moved.mu.Unlock()
	if paused != "sb1" {
		t.Fatalf("the moved node saw pauses %q, want sb1", paused)
	}
}

// GET /nodes through a replica counts the sandboxes another replica
// recorded or removed, at once: found on the real cluster, where after a
// drain killed every sandbox `cube node ls` through the other replica still
// showed 4 until its next Sync.
func TestNodeListingCountsOtherReplicasSandboxes(t *testing.T) {
	rs, sts := replicas(t, 2, Config{HeartbeatInterval: time.Hour})
	a, b := rs[0], rs[1]
	ctx := context.Background()
	registeredOnBoth(t, a, b, newTokenNode(t, "t1"))
	storeRunning(t, sts[0], "sb1", "sb2")
	key, err := sts[1].CreateKey(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(NewAdminHandler(b, sts[1]))
	defer api.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"/nodes/n1", nil)
	req.Header.Set("X-API-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var st NodeStatus
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil || st.Sandboxes != 2 {
		t.Fatalf("GET /nodes/n1 through B after A recorded 2 sandboxes: %+v, %v", st, err)
	}
}

// A sandbox replica A has just made on a node, and not yet recorded, is in
// the node's next heartbeat; when that heartbeat reaches replica B, B must
// not tell the node to kill it (before, it did at first sight). A sandbox
// that stays unknown is a real stray and goes a few heartbeats later.
func TestHeartbeatSparesSandboxAnotherReplicaIsRecording(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Now())
	rs, _ := replicas(t, 2, Config{HeartbeatInterval: time.Hour, Clock: clk})
	a, b := rs[0], rs[1]
	ctx := context.Background()
	node := newTokenNode(t, "t1")
	registeredOnBoth(t, a, b, node)
	if _, err := a.CreateSandbox(ctx, createReq("sb1")); err != nil {
		t.Fatal(err)
	}
	kill, _, err := b.Heartbeat(ctx, "n1", []string{"sb1"}, nil, nil)
	if err != nil || len(kill) != 0 {
		t.Fatalf("heartbeat through B right after A's create: kill %v, %v", kill, err)
	}
	clk.SetTime(clk.Now().Add(strayGrace - time.Second))
	if kill, _, _ := b.Heartbeat(ctx, "n1", []string{"sb1"}, nil, nil); len(kill) != 0 {
		t.Fatalf("killed within the grace: %v", kill)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	if kill, _, _ := b.Heartbeat(ctx, "n1", []string{"sb1"}, nil, nil); len(kill) != 1 || kill[0] != "sb1" {
		t.Fatalf("a sandbox unknown for the whole grace is a stray: kill %v", kill)
	}
	// A sandbox no longer reported is forgotten: if it comes back unknown,
	// its grace starts again.
	if _, _, err := b.Heartbeat(ctx, "n1", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if kill, _, _ := b.Heartbeat(ctx, "n1", []string{"sb1"}, nil, nil); len(kill) != 0 {
		t.Fatalf("sighting not forgotten: kill %v", kill)
	}
}
