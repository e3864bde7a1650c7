package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// lifecycleRecorder is the master's side as seen by the registry: it
// forgets sandboxes in the real store and records what was asked.
type lifecycleRecorder struct {
	st interface {
		DeleteSandbox(context.Context, string) error
	}
	mu        sync.Mutex
	forgotten []string
}

func (l *lifecycleRecorder) Kill(ctx context.Context, id string) error { return l.Forget(ctx, id) }
func (l *lifecycleRecorder) Forget(ctx context.Context, id string) error {
	l.mu.Lock()
	l.forgotten = append(l.forgotten, id)
	l.mu.Unlock()
	return l.st.DeleteSandbox(ctx, id)
}

func newTestRegistry(t *testing.T) (*Registry, *store.SQLite, *lifecycleRecorder) {
	t.Helper()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := NewRegistry(Config{ServerVersion: "v0.5.0", Recent: time.Millisecond}, DocumentNodes{Docs: st}, st)
	life := &lifecycleRecorder{st: st}
	r.SetLifecycle(life)
	return r, st, life
}

func rec(id, version string) NodeRecord {
	return NodeRecord{ID: id, Version: version, RPCURL: "http://127.0.0.1:1", DataIP: "127.0.0.1", Token: "t",
		Capacity: Capacity{CPUCount: 8, MemoryMB: 8192, MaxSandboxes: 10}, Templates: []TemplateRef{{Name: "base", CPUCount: 2, MemoryMB: 512}}}
}

func TestRegisterSkewAndPersistence(t *testing.T) {
	r, st, _ := newTestRegistry(t)
	ctx := context.Background()
	if err := r.Register(ctx, rec("new", "v0.6.0")); !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "v0.6.0") || !strings.Contains(err.Error(), "v0.5.0") {
		t.Fatalf("newer cubelet: %v", err)
	}
	if err := r.Register(ctx, rec("old", "v0.3.0")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("two minors older: %v", err)
	}
	if err := r.Register(ctx, NodeRecord{ID: "x", Version: "v0.5.0"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("incomplete registration: %v", err)
	}
	if err := r.Register(ctx, rec("n1", "v0.4.2")); err != nil {
		t.Fatalf("one minor older: %v", err)
	}
	if err := r.Isolate(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := r.Drain(ctx, "n1", Drain{Policy: DrainWait, Grace: time.Minute}); err != nil {
		t.Fatal(err)
	}
	first, _ := r.Node("n1")
	// Re-registration (cubelet restart) keeps operator state; a new
	// registry (server restart) loads it from the store: drains resume.
	if err := r.Register(ctx, rec("n1", "v0.5.0")); err != nil {
		t.Fatal(err)
	}
	r2 := NewRegistry(Config{ServerVersion: "v0.5.0"}, DocumentNodes{Docs: st}, st)
	if err := r2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := r2.Node("n1")
	if err != nil || got.State != StateDraining || got.Version != "v0.5.0" || got.Drain == nil || !got.Drain.StartedAt.Equal(first.Drain.StartedAt) {
		t.Fatalf("after reload: %+v %v (drain started %v)", got, err, first.Drain)
	}
	if err := r.Drain(ctx, "n1", Drain{Policy: "sometimes"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad policy: %v", err)
	}
	if err := r.Isolate(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown node: %v", err)
	}
}

func TestHeartbeatReconcilesWithRecords(t *testing.T) {
	r, st, life := newTestRegistry(t)
	ctx := context.Background()
	if err := r.Register(ctx, rec("n1", "v0.5.0")); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r.mu.Lock()
	r.cfg.Recent = time.Hour
	r.mu.Unlock()
	for id, started := range map[string]time.Time{"kept": now.Add(-2 * time.Hour), "lost": now.Add(-2 * time.Hour), "just-made": now} {
		if err := st.CreateSandbox(ctx, store.Sandbox{ID: id, TemplateID: "base", NodeID: "n1", StartedAt: started, EndAt: now.Add(time.Hour),
			State: store.StateRunning, CPUCount: 2, MemoryMB: 512, EnvdVersion: "0.5.7", EnvdAccessToken: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	// The node runs "kept" and a sandbox the server never recorded; "lost"
	// is gone from the node. "just-made" was recorded a moment ago (by
	// another replica, so this one has it in no recent list): the node's
	// list may predate it, so it is not lost. Before, it was forgotten
	// (a real-cluster run lost a sandbox 18 ms after its create).
	kill, rereg, err := r.Heartbeat(ctx, "n1", []string{"kept", "stray"}, nil, nil)
	if err != nil || rereg {
		t.Fatal(err, rereg)
	}
	if len(kill) != 0 {
		t.Fatalf("kill list %v at first sight, want none (another replica may be recording it)", kill)
	}
	if len(life.forgotten) != 1 || life.forgotten[0] != "lost" {
		t.Fatalf("forgotten %v, want [lost]", life.forgotten)
	}
	if st, _ := r.Node("n1"); st.Sandboxes != 2 || st.UsedCPU != 4 {
		t.Fatalf("accounting after reconcile: %+v", st)
	}
	// A sandbox still being created is not a stray.
	r.mu.Lock()
	r.cfg.Recent = time.Hour
	r.recent["creating"] = time.Now()
	r.mu.Unlock()
	if kill, _, _ := r.Heartbeat(ctx, "n1", []string{"kept", "creating"}, nil, nil); len(kill) != 0 {
		t.Fatalf("in-flight create reported as stray: %v", kill)
	}
	// Unknown nodes are told to register again.
	if _, rereg, _ := r.Heartbeat(ctx, "ghost", nil, nil, nil); !rereg {
		t.Fatal("unknown node not asked to re-register")
	}
}

func TestDeleteRules(t *testing.T) {
	r, st, life := newTestRegistry(t)
	ctx := context.Background()
	r.Register(ctx, rec("n1", "v0.5.0"))
	now := time.Now()
	st.CreateSandbox(ctx, store.Sandbox{ID: "s1", TemplateID: "base", NodeID: "n1", StartedAt: now, EndAt: now.Add(time.Hour),
		State: store.StateRunning, CPUCount: 1, MemoryMB: 1, EnvdVersion: "0.5.7", EnvdAccessToken: "x"})
	r.recount(ctx)
	if err := r.Delete(ctx, "n1", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("delete ready node: %v", err)
	}
	r.Isolate(ctx, "n1")
	if err := r.Delete(ctx, "n1", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("delete non-empty isolated node: %v", err)
	}
	if err := r.Delete(ctx, "n1", true); err != nil {
		t.Fatal(err)
	}
	if len(life.forgotten) != 1 {
		t.Fatalf("forced delete forgot %v", life.forgotten)
	}
	if nodes, _ := (DocumentNodes{Docs: st}).ListNodes(ctx); len(nodes) != 0 {
		t.Fatalf("node record left: %v", nodes)
	}
}

func TestDrainPhases(t *testing.T) {
	r := NewRegistry(Config{}, nil, nil)
	now := time.Now()
	cases := []struct {
		d    Drain
		want string
	}{
		{Drain{Policy: DrainKill, Grace: time.Minute, StartedAt: now}, "grace"},
		{Drain{Policy: DrainKill, Grace: time.Minute, StartedAt: now.Add(-2 * time.Minute)}, "killing"},
		{Drain{Policy: DrainWait, Grace: time.Minute, StartedAt: now.Add(-2 * time.Minute)}, "waiting"},
		{Drain{Policy: DrainWait, Grace: time.Minute, Deadline: time.Minute, StartedAt: now.Add(-3 * time.Minute)}, "killing"},
	}
	for _, c := range cases {
		if got := r.drainPhase(c.d); got != c.want {
			t.Errorf("%+v: phase %s, want %s", c.d, got, c.want)
		}
	}
}

// TestHeartbeatsNeverUndoOperatorActions: heartbeats racing with isolate
// and drain must not write back a stale copy of the node record (a bug the
// two-node cluster test hit: a heartbeat persisted Isolated=false right
// after an isolate, and the next sync made the node schedulable again).
func TestHeartbeatsNeverUndoOperatorActions(t *testing.T) {
	r, st, _ := newTestRegistry(t)
	ctx := context.Background()
	if err := r.Register(ctx, rec("n1", "v0.5.0")); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					if _, _, err := r.Heartbeat(ctx, "n1", nil, nil, nil); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		if err := r.Isolate(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := r.Uncordon(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Drain(ctx, "n1", Drain{Policy: DrainWait, Grace: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let heartbeats race with the final state
	close(stop)
	wg.Wait()
	nodes, err := (DocumentNodes{Docs: st}).ListNodes(ctx)
	if err != nil || len(nodes) != 1 || !nodes[0].Isolated || nodes[0].Drain == nil {
		t.Fatalf("stored record lost the drain: %+v %v", nodes, err)
	}
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Node("n1"); got.State != StateDraining {
		t.Fatalf("state after sync: %s", got.State)
	}
}

// TestRecountKeepsUnrecordedCreates: a recount (heartbeat, sync) that runs
// between a node creating a sandbox and the master recording it must not
// drop it from the node's load (the multi-host PostgreSQL run saw a node
// holding 21 sandboxes while the server counted 20).
func TestRecountKeepsUnrecordedCreates(t *testing.T) {
	r, st, _ := newTestRegistry(t)
	r.cfg.Recent = time.Hour
	ctx := context.Background()
	if err := r.Register(ctx, rec("n1", "v0.5.0")); err != nil {
		t.Fatal(err)
	}
	_, _, release, err := r.reserve("fresh", Request{Template: "base", CPU: 2, MemoryMB: 512}, supply{})
	if err != nil {
		t.Fatal(err)
	}
	r.recount(ctx)
	if got, _ := r.Node("n1"); got.UsedCPU != 2 || got.Inflight != 1 {
		t.Fatalf("in flight after recount: %+v", got)
	}
	release(true)
	r.recount(ctx)
	if got, _ := r.Node("n1"); got.Sandboxes != 1 || got.UsedCPU != 2 {
		t.Fatalf("created, not yet recorded, after recount: %+v", got)
	}
	now := time.Now()
	st.CreateSandbox(ctx, store.Sandbox{ID: "fresh", TemplateID: "base", NodeID: "n1", StartedAt: now, EndAt: now.Add(time.Hour),
		State: store.StateRunning, CPUCount: 2, MemoryMB: 512, EnvdVersion: "0.5.7", EnvdAccessToken: "x"})
	r.recount(ctx)
	if got, _ := r.Node("n1"); got.Sandboxes != 1 || got.UsedCPU != 2 {
		t.Fatalf("recorded: counted once? %+v", got)
	}
	// A failed create gives everything back.
	_, _, release, _ = r.reserve("failed", Request{Template: "base", CPU: 2, MemoryMB: 512}, supply{})
	release(false)
	r.recount(ctx)
	if got, _ := r.Node("n1"); got.Sandboxes != 1 || got.UsedCPU != 2 {
		t.Fatalf("after a failed create: %+v", got)
	}
}
