package master

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// fakeNode is an in-memory node; the api package tests use one with real
// listeners.
type fakeNode struct {
	mu        sync.Mutex
	live      map[string]string // id -> "running"|"paused"
	killed    []string
	createErr error
	killErr   error
	network   map[string]NetworkPolicy
	// nodeToken, when set, is the token the node gives a sandbox whose
	// create lets it choose one (a pre-started slot's).
	nodeToken string
}

func newFakeNode() *fakeNode {
	return &fakeNode{live: map[string]string{}, network: map[string]NetworkPolicy{}}
}

func (n *fakeNode) CreateSandbox(ctx context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.createErr != nil {
		return nodeproto.Sandbox{}, n.createErr
	}
	n.live[req.SandboxID] = "running"
	sb := nodeproto.Sandbox{ID: req.SandboxID, Template: req.Template, IP: netip.MustParseAddr("127.0.0.1"),
		EnvdVersion: "0.2.0", StartedAt: time.Now()}
	if req.NodeMayChooseToken && n.nodeToken != "" {
		sb.EnvdAccessToken = n.nodeToken
	}
	return sb, nil
}

func (n *fakeNode) KillSandbox(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.killErr != nil {
		return n.killErr
	}
	if _, ok := n.live[id]; !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	delete(n.live, id)
	n.killed = append(n.killed, id)
	return nil
}

func (n *fakeNode) state(id string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.live[id]
}

func (n *fakeNode) SandboxAddr(ctx context.Context, id string, port uint16) (string, error) {
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

func (n *fakeNode) SandboxMetrics(ctx context.Context, id string) (nodeproto.Metrics, error) {
	return nodeproto.Metrics{CPUCount: 2, MemUsed: 42}, nil
}

func (n *fakeNode) PauseSandbox(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.live[id] = "paused"
	return nil
}

func (n *fakeNode) ResumeSandbox(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.live[id] = "running"
	return nil
}

func (n *fakeNode) Template(ctx context.Context, name string) (TemplateInfo, error) {
	if name != "base" {
		return TemplateInfo{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	return TemplateInfo{Name: "base", CPUCount: 1, MemoryMB: 512, DiskSizeMB: 2048}, nil
}

// netNode adds NetworkUpdater.
type netNode struct{ *fakeNode }

func (n netNode) UpdateNetwork(ctx context.Context, id string, p NetworkPolicy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.network[id] = p
	return nil
}

func newTestMaster(t *testing.T, node Node) (*Master, *store.SQLite) {
	t.Helper()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	m := New(st, node, Config{Domain: "cube.test", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := m.Shutdown(ctx, false); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		st.Close()
	})
	return m, st
}

func dur(d time.Duration) *time.Duration { return &d }

// waitFor polls cond for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCreateValidation(t *testing.T) {
	m, _ := newTestMaster(t, newFakeNode())
	ctx := context.Background()
	big := map[string]string{}
	for i := 0; i <= MaxMapEntries; i++ {
		big[fmt.Sprint(i)] = "v"
	}
	cases := map[string]CreateParams{
		"no template":      {},
		"unknown template": {TemplateID: "nope"},
		"zero timeout":     {TemplateID: "base", Timeout: dur(0)},
		"negative timeout": {TemplateID: "base", Timeout: dur(-time.Second)},
		"huge timeout":     {TemplateID: "base", Timeout: dur(MaxTimeout + time.Second)},
		"too much meta":    {TemplateID: "base", Metadata: big},
		"empty env key":    {TemplateID: "base", EnvVars: map[string]string{"": "x"}},
		"env key with =":   {TemplateID: "base", EnvVars: map[string]string{"A=B": "x"}},
		"bad denyOut":      {TemplateID: "base", Network: &Network{DenyOut: []string{"example.com"}}},
		"bad allowOut":     {TemplateID: "base", Network: &Network{AllowOut: []string{"not a host!"}}},
		"bad https port":   {TemplateID: "base", Network: &Network{HTTPSPorts: []int{49983}}},
	}
	for name, p := range cases {
		if _, err := m.Create(ctx, p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	// Egress rules need a NetworkUpdater.
	_, err := m.Create(ctx, CreateParams{TemplateID: "base", Network: &Network{DenyOut: []string{"10.0.0.0/8"}}})
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("egress rules without updater: %v", err)
	}
}

func TestCreateDefaultsAndNodeFailure(t *testing.T) {
	node := newFakeNode()
	m, st := newTestMaster(t, node)
	ctx := context.Background()
	before := time.Now()
	sb, err := m.Create(ctx, CreateParams{TemplateID: "base", Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if !ValidSandboxID(sb.ID) || len(sb.EnvdAccessToken) != 64 || sb.CPUCount != 1 || sb.MemoryMB != 512 || sb.DiskSizeMB != 2048 {
		t.Fatalf("created: %+v", sb)
	}
	if d := sb.EndAt.Sub(before); d < DefaultTimeout || d > DefaultTimeout+5*time.Second {
		t.Fatalf("default endAt is %v after create", d)
	}
	node.mu.Lock()
	node.createErr = fmt.Errorf("no slots: %w", errdefs.ErrResourceExhausted)
	node.mu.Unlock()
	_, err = m.Create(ctx, CreateParams{TemplateID: "base"})
	if errdefs.HTTPStatus(err) != 503 {
		t.Fatalf("capacity error maps to %d (%v), want 503", errdefs.HTTPStatus(err), err)
	}
	all, _ := st.AllSandboxes(ctx)
	if len(all) != 1 {
		t.Fatalf("failed create persisted something: %d records", len(all))
	}
}

// TestCreateRecordsTheNodesToken: the token a node chose (a pre-started
// slot's) is the one recorded and returned; a node that chose none (an
// older cubelet, or a create that needed envd's /init) runs with the
// server's.
func TestCreateRecordsTheNodesToken(t *testing.T) {
	node := newFakeNode()
	m, st := newTestMaster(t, node)
	ctx := context.Background()
	own, err := m.Create(ctx, CreateParams{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if len(own.EnvdAccessToken) != 64 {
		t.Fatalf("server token %q", own.EnvdAccessToken)
	}
	node.mu.Lock()
	node.nodeToken = strings.Repeat("ab", 32)
	node.mu.Unlock()
	sb, err := m.Create(ctx, CreateParams{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := st.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sb.EnvdAccessToken != node.nodeToken || stored.EnvdAccessToken != node.nodeToken {
		t.Fatalf("returned %q, stored %q, want the node's %q", sb.EnvdAccessToken, stored.EnvdAccessToken, node.nodeToken)
	}
}

func TestExpiryKillsAtShortenedEnd(t *testing.T) {
	node := newFakeNode()
	m, st := newTestMaster(t, node)
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	keep, _ := m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(time.Hour)})
	var gone []string
	var mu sync.Mutex
	m.OnGone(func(id string) { mu.Lock(); gone = append(gone, id); mu.Unlock() })
	start := time.Now()
	if err := m.SetTimeout(ctx, sb.ID, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "expiry kill", func() bool { return node.state(sb.ID) == "" })
	if el := time.Since(start); el < 250*time.Millisecond {
		t.Fatalf("killed too early: %v", el)
	}
	// The record goes once the node's kill has returned, a moment after
	// the node forgot the sandbox.
	waitFor(t, "record deleted after expiry", func() bool {
		_, err := st.GetSandbox(ctx, sb.ID)
		return errors.Is(err, errdefs.ErrNotFound)
	})
	if node.state(keep.ID) != "running" {
		t.Fatal("expiry killed the wrong sandbox")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(gone) != 1 || gone[0] != sb.ID {
		t.Fatalf("gone notifications: %v", gone)
	}
}

func TestExpiryPausesWithAutoPauseAndRetriesFailures(t *testing.T) {
	node := newFakeNode()
	m, st := newTestMaster(t, node)
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(200 * time.Millisecond), AutoPause: true})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "auto pause", func() bool { return node.state(sb.ID) == "paused" })
	got, _ := st.GetSandbox(ctx, sb.ID)
	if got.State != store.StatePaused {
		t.Fatalf("state = %s", got.State)
	}
	// A paused sandbox does not expire; connect resumes it.
	got, resumed, err := m.Connect(ctx, sb.ID, dur(time.Hour))
	if err != nil || !resumed || got.State != store.StateRunning || node.state(sb.ID) != "running" {
		t.Fatalf("connect paused: %+v %v %v", got, resumed, err)
	}
}

func TestExpiryRestoreKillsExpiredFromStore(t *testing.T) {
	node := newFakeNode()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	// A record left by a previous run, already expired.
	node.live["oldoldoldoldoldold01"] = "running"
	st.CreateSandbox(ctx, store.Sandbox{ID: "oldoldoldoldoldold01", TemplateID: "base", StartedAt: time.Now().Add(-time.Hour),
		EndAt: time.Now().Add(-time.Minute), State: store.StateRunning, EnvdVersion: "0.2.0"})
	m := New(st, node, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer m.Shutdown(ctx, false)
	if err := m.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "restored expiry", func() bool { return node.state("oldoldoldoldoldold01") == "" })
}

func TestConnectExtendsOnly(t *testing.T) {
	m, _ := newTestMaster(t, newFakeNode())
	ctx := context.Background()
	sb, _ := m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(time.Hour)})
	got, resumed, err := m.Connect(ctx, sb.ID, dur(time.Minute))
	if err != nil || resumed || !got.EndAt.Equal(sb.EndAt) {
		t.Fatalf("shorter connect changed endAt: %v -> %v (%v, %v)", sb.EndAt, got.EndAt, resumed, err)
	}
	got, _, _ = m.Connect(ctx, sb.ID, dur(2*time.Hour))
	if !got.EndAt.After(sb.EndAt) {
		t.Fatal("longer connect did not extend")
	}
	if _, _, err := m.Connect(ctx, "unknownunknownunkno1", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("connect unknown: %v", err)
	}
	if _, _, err := m.Connect(ctx, sb.ID, dur(-time.Second)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("connect negative: %v", err)
	}
	// Refresh also only extends.
	before, _ := m.Get(ctx, sb.ID)
	if err := m.Refresh(ctx, sb.ID, dur(time.Second)); err != nil {
		t.Fatal(err)
	}
	after, _ := m.Get(ctx, sb.ID)
	if !after.EndAt.Equal(before.EndAt) {
		t.Fatal("refresh shortened endAt")
	}
	if err := m.Refresh(ctx, sb.ID, dur(2*MaxRefresh)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("huge refresh: %v", err)
	}
}

func TestPauseAndAddr(t *testing.T) {
	m, _ := newTestMaster(t, newFakeNode())
	ctx := context.Background()
	sb, _ := m.Create(ctx, CreateParams{TemplateID: "base"})
	if addr, err := m.SandboxAddr(ctx, sb.ID, 8080); err != nil || addr != "127.0.0.1:8080" {
		t.Fatalf("addr: %q %v", addr, err)
	}
	if err := m.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(ctx, sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second pause: %v", err)
	}
	if _, err := m.SandboxAddr(ctx, sb.ID, 8080); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("addr of paused: %v", err)
	}
	for _, id := range []string{"unknownunknownunkno1", "../../etc", ""} {
		if _, err := m.SandboxAddr(ctx, id, 1); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("addr of %q: %v", id, err)
		}
	}
	if err := m.Pause(ctx, "unknownunknownunkno1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("pause unknown: %v", err)
	}
	mt, err := m.Metrics(ctx, sb.ID)
	if err != nil || mt.MemUsed != 42 || mt.Timestamp.IsZero() {
		t.Fatalf("metrics: %+v %v", mt, err)
	}
}

func TestKillErrorsAndShutdown(t *testing.T) {
	node := newFakeNode()
	m, st := newTestMaster(t, node)
	ctx := context.Background()
	a, _ := m.Create(ctx, CreateParams{TemplateID: "base"})
	b, _ := m.Create(ctx, CreateParams{TemplateID: "base"})
	m.Pause(ctx, b.ID)
	node.mu.Lock()
	node.killErr = fmt.Errorf("node down: %w", errdefs.ErrUnavailable)
	node.mu.Unlock()
	if err := m.Kill(ctx, a.ID); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("kill with node down: %v", err)
	}
	if _, err := st.GetSandbox(ctx, a.ID); err != nil {
		t.Fatal("record dropped although the node kill failed")
	}
	node.mu.Lock()
	node.killErr = nil
	delete(node.live, a.ID) // the node lost it: kill still forgets the record
	node.mu.Unlock()
	if err := m.Kill(ctx, a.ID); err != nil {
		t.Fatalf("kill of a sandbox the node forgot: %v", err)
	}
	if err := m.Kill(ctx, a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second kill: %v", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.Shutdown(sctx, true); err != nil {
		t.Fatal(err)
	}
	if all, _ := st.AllSandboxes(ctx); len(all) != 0 || node.state(b.ID) != "" {
		t.Fatalf("shutdown left %d records", len(all))
	}
}

func TestUpdateNetwork(t *testing.T) {
	node := netNode{newFakeNode()}
	m, st := newTestMaster(t, node)
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateParams{TemplateID: "base",
		Network: &Network{AllowOut: []string{"example.com"}, DenyOut: []string{"0.0.0.0/0"}, MaskRequestHost: "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if p := node.network[sb.ID]; !p.AllowInternet || len(p.Network.DenyOut) != 1 {
		t.Fatalf("policy at create: %+v", p)
	}
	no := false
	err = m.UpdateNetwork(ctx, sb.ID, NetworkUpdate{AllowInternetAccess: &no, DenyOut: []string{"10.0.0.0/8", "1.2.3.4"},
		Rules: map[string][]NetworkRule{"*.Example.COM": nil}})
	if err != nil {
		t.Fatal(err)
	}
	p := node.network[sb.ID]
	if p.AllowInternet || len(p.Network.AllowOut) != 0 || p.Network.MaskRequestHost != "x" {
		t.Fatalf("policy after update: %+v", p)
	}
	if _, ok := p.Network.Rules["*.example.com"]; !ok {
		t.Fatalf("rule hosts not lowercased: %v", p.Network.Rules)
	}
	rec, _ := st.GetSandbox(ctx, sb.ID)
	if rec.AllowInternetAccess == nil || *rec.AllowInternetAccess {
		t.Fatal("allow_internet_access not stored")
	}
	if err := m.UpdateNetwork(ctx, sb.ID, NetworkUpdate{DenyOut: []string{"10.0.0.0/33"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad CIDR: %v", err)
	}
	if err := m.UpdateNetwork(ctx, "unknownunknownunkno1", NetworkUpdate{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	plain, _ := newTestMaster(t, newFakeNode())
	sb2, _ := plain.Create(ctx, CreateParams{TemplateID: "base"})
	if err := plain.UpdateNetwork(ctx, sb2.ID, NetworkUpdate{}); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("node without updater: %v", err)
	}
}

func TestSandboxIDShape(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 200; i++ {
		id, err := newSandboxID()
		if err != nil || !ValidSandboxID(id) || seen[id] {
			t.Fatalf("id %q: %v", id, err)
		}
		seen[id] = true
	}
}
