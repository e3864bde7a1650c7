package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// A server that starts over stored node records reports a node Ready only
// once the node has answered since the start: a cubelet that restarted
// (new token) and has not registered again is Pending, takes no sandbox,
// and becomes Ready when it registers; one that answers with its stored
// token is Ready at once.
func TestRestartedServerConfirmsNodes(t *testing.T) {
	rs, sts := replicas(t, 1, Config{HeartbeatInterval: time.Hour, ProbeTimeout: 2 * time.Second})
	ctx := context.Background()
	node := newTokenNode(t, "t1")
	if err := rs[0].Register(ctx, node.record("t1")); err != nil {
		t.Fatal(err)
	}
	restart := func() *Registry {
		t.Helper()
		r := NewRegistry(Config{ServerVersion: "v0.5.0", HeartbeatInterval: time.Hour, ProbeTimeout: 2 * time.Second},
			DocumentNodes{Docs: sts[0]}, sts[0])
		r.SetLifecycle(&lifecycleRecorder{st: sts[0]})
		if err := r.Load(ctx); err != nil {
			t.Fatal(err)
		}
		return r
	}

	// The node answers with the token on record: Ready at once.
	if st, _ := restart().Node("n1"); st.State != StateReady {
		t.Fatalf("node answering its stored token after a server restart: %+v", st)
	}

	// The cubelet restarted (new token) and has not registered yet.
	node.restart("t2")
	r := restart()
	st, err := r.Node("n1")
	if err != nil || st.State != StatePending || !strings.Contains(st.Reason, "waiting for the node") {
		t.Fatalf("restarted node before it registers: %+v, %v", st, err)
	}
	_, _, _, err = r.reserve("sb1", Request{Template: "base", CPU: 1, MemoryMB: 128}, supply{server: true})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "n1: node is Pending") {
		t.Fatalf("scheduling on a Pending node: %v", err)
	}
	// Deleting it needs isolation first, as for a Ready node.
	if err := r.Delete(ctx, "n1", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("delete of a Pending node without force: %v", err)
	}
	if err := r.Register(ctx, node.record("t2")); err != nil {
		t.Fatal(err)
	}
	if st, _ := r.Node("n1"); st.State != StateReady || st.Reason != "" {
		t.Fatalf("after registering: %+v", st)
	}
}

// Replicas share confirmation through the store: a node that heartbeats
// through one replica after another replica started is Ready on both.
func TestPendingNodeConfirmedThroughAnotherReplica(t *testing.T) {
	rs, sts := replicas(t, 1, Config{HeartbeatInterval: time.Hour})
	ctx := context.Background()
	node := newTokenNode(t, "t1")
	if err := rs[0].Register(ctx, node.record("t1")); err != nil {
		t.Fatal(err)
	}
	node.restart("t2") // a new replica's probe with t1 fails
	b := NewRegistry(Config{ServerVersion: "v0.5.0", HeartbeatInterval: time.Hour}, DocumentNodes{Docs: sts[0]}, sts[0])
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Node("n1"); st.State != StatePending {
		t.Fatalf("on the new replica before any heartbeat: %+v", st)
	}
	if err := rs[0].Register(ctx, node.record("t2")); err != nil { // through the old replica
		t.Fatal(err)
	}
	if _, _, err := rs[0].Heartbeat(ctx, "n1", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Node("n1"); st.State != StateReady {
		t.Fatalf("on the new replica after a heartbeat through the other: %+v", st)
	}
}
