package master

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/leader"
	"github.com/cube-dev/cube/internal/pgtest"
	"github.com/cube-dev/cube/internal/store"
)

// killCounter wraps the shared node and records which replica killed what.
type killCounter struct {
	*fakeNode
	mu     sync.Mutex
	killed map[string]time.Time
}

func (k *killCounter) KillSandbox(ctx context.Context, id string) error {
	if err := k.fakeNode.KillSandbox(ctx, id); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed[id] = time.Now()
	return nil
}

func (k *killCounter) kills() map[string]time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]time.Time, len(k.killed))
	for id, at := range k.killed {
		out[id] = at
	}
	return out
}

// replica is one server replica: a master with its own PostgreSQL store
// handle and elector, talking to the node all replicas share.
type replica struct {
	name  string
	m     *Master
	st    *store.PostgreSQL
	node  *killCounter
	close func()
}

func newReplica(t *testing.T, name, dsn string, node *fakeNode) *replica {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenPostgreSQL(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	el, err := leader.NewPostgres(dsn, leader.PostgresConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	kc := &killCounter{fakeNode: node, killed: map[string]time.Time{}}
	m := New(st, kc, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Elector: el})
	if err := m.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, m: m, st: st, node: kc}
	r.close = sync.OnceFunc(func() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := m.Shutdown(sctx, false); err != nil {
			t.Errorf("%s: shutdown: %v", name, err)
		}
		st.Close()
	})
	t.Cleanup(r.close)
	return r
}

// waitKilled waits up to bound for id to be killed by any replica and
// returns the replica that did and when.
func waitKilled(t *testing.T, bound time.Duration, id string, rs ...*replica) (*replica, time.Time) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		for _, r := range rs {
			if at, ok := r.node.kills()[id]; ok {
				return r, at
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("sandbox %s not expired within %v", id, bound)
	return nil, time.Time{}
}

// waitForgotten waits (up to 5 s) until r no longer knows sandbox id.
func waitForgotten(t *testing.T, r *replica, id string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err = r.m.Get(context.Background(), id); errors.Is(err, errdefs.ErrNotFound) {
			return
		}
	}
	t.Fatalf("expired sandbox %s still recorded: %v", id, err)
}

func TestTwoMastersShareOnePostgreSQL(t *testing.T) {
	const handoverBound = 15 * time.Second
	srv := pgtest.New(t)
	dsn := srv.NewDatabase(t)
	node := newFakeNode()
	a := newReplica(t, "a", dsn, node)
	b := newReplica(t, "b", dsn, node)
	ctx := context.Background()

	// Created through one replica, visible through the other.
	viaA, err := a.m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(time.Hour), Metadata: map[string]string{"via": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	viaB, err := b.m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(time.Hour), Metadata: map[string]string{"via": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b.m.Get(ctx, viaA.ID); err != nil || got.Metadata["via"] != "a" {
		t.Fatalf("b cannot see a's sandbox: %+v %v", got, err)
	}
	if p, err := a.m.List(ctx, store.ListFilter{Metadata: map[string]string{"via": "b"}}); err != nil || len(p.Sandboxes) != 1 || p.Sandboxes[0].ID != viaB.ID {
		t.Fatalf("a cannot list b's sandbox: %+v %v", p, err)
	}

	// Long-lived sandboxes through both replicas: none may be lost.
	keep := []string{viaA.ID, viaB.ID}
	for i := range 8 {
		r := []*replica{a, b}[i%2]
		sb, err := r.m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, sb.ID)
	}

	// Short-lived sandboxes through both: exactly one replica (the leader)
	// expires all of them.
	var short []string
	for i := range 6 {
		r := []*replica{a, b}[i%2]
		sb, err := r.m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(500 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		short = append(short, sb.ID)
	}
	var lead, follower *replica
	for _, id := range short {
		r, _ := waitKilled(t, handoverBound, id, a, b)
		if lead == nil {
			lead = r
		}
		if r != lead {
			t.Fatalf("both replicas expired sandboxes: %s by %s, earlier ones by %s", id, r.name, lead.name)
		}
		// The expiry loop deletes the record once the node's kill has returned:
		// right after the node saw the kill it may still be there.
		waitForgotten(t, b, id)
	}
	follower = map[*replica]*replica{a: b, b: a}[lead]
	if n := len(follower.node.kills()); n != 0 {
		t.Fatalf("follower %s killed %d sandboxes", follower.name, n)
	}
	t.Logf("%s leads the expiry loop", lead.name)

	// A sandbox that expires right after the leader stops: the follower must
	// take over and expire it within the bound.
	late, err := follower.m.Create(ctx, CreateParams{TemplateID: "base", Timeout: dur(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	lead.close()
	stopped := time.Now()
	r, at := waitKilled(t, handoverBound+time.Second, late.ID, a, b)
	if r != follower {
		t.Fatalf("sandbox %s expired by %s after it stopped", late.ID, r.name)
	}
	// The sandbox expired 1 s after creation; measure from the later of
	// that and the leader's stop.
	t.Logf("leader %s stopped; %s killed an expired sandbox %v later", lead.name, follower.name, at.Sub(stopped))
	if took := at.Sub(stopped); took > handoverBound {
		t.Fatalf("handover took %v, want <= %v", took, handoverBound)
	}

	// No record lost, nothing long-lived killed.
	all, err := follower.st.AllSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(keep) {
		t.Fatalf("%d records after handover, want %d", len(all), len(keep))
	}
	for _, id := range keep {
		if _, err := follower.m.Get(ctx, id); err != nil {
			t.Fatalf("record %s lost: %v", id, err)
		}
		if node.state(id) != "running" {
			t.Fatalf("long-lived sandbox %s is %q on the node", id, node.state(id))
		}
	}
	// The new leader also follows end times changed after handover.
	if err := follower.m.SetTimeout(ctx, keep[0], 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitKilled(t, 5*time.Second, keep[0], follower)
}
