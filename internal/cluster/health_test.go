package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
)

func health(serving bool, state string, gen int, failed ...string) *NodeHealth {
	h := &NodeHealth{
		Socket:    SocketHealth{Serving: serving, Address: "http://127.0.0.1:7070", CheckedAt: time.Now().UTC()},
		Preflight: PreflightHealth{State: state, Generation: gen, At: time.Now().UTC(), FailedChecks: failed},
	}
	if !serving {
		h.Socket.Error = "connection refused"
	}
	return h
}

// TestHealthStoredAndShared: the health a node registers with is replaced
// by each heartbeat that carries one, kept by one that does not, and is
// read by another replica from the store.
func TestHealthStoredAndShared(t *testing.T) {
	r, st, _ := newTestRegistry(t)
	ctx := context.Background()
	n := rec("n1", "v0.5.0")
	n.Health = health(true, PrepPassed, 1)
	if err := r.Register(ctx, n); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Node("n1"); got.Health == nil || got.Health.Preflight.Generation != 1 || !got.Health.Socket.Serving {
		t.Fatalf("after register: %+v", got.Health)
	}
	if _, _, err := r.Heartbeat(ctx, "n1", nil, nil, health(false, PrepFailed, 2, "kernel.nftables: x")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Heartbeat(ctx, "n1", nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	got, _ := r.Node("n1")
	if h := got.Health; h == nil || h.Socket.Serving || h.Preflight.State != PrepFailed || h.Preflight.Generation != 2 {
		t.Fatalf("after heartbeats: %+v", got.Health)
	}
	other := NewRegistry(Config{ServerVersion: "v0.5.0"}, DocumentNodes{Docs: st}, st)
	if err := other.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Heartbeat(ctx, "n1", nil, nil, health(true, PrepPassed, 2)); err != nil {
		t.Fatal(err)
	}
	if err := other.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if h := other.Nodes()[0].Health; h == nil || !h.Socket.Serving || h.Preflight.State != PrepPassed || h.Preflight.Generation != 2 {
		t.Fatalf("other replica sees %+v", h)
	}
}

func TestHealthFromProto(t *testing.T) {
	if healthFromProto(nil) != nil {
		t.Fatal("nil health must stay nil (cubelet that does not report it)")
	}
	h := healthFromProto(&nodev1.NodeHealth{
		Socket:    &nodev1.SocketHealth{Serving: true, Address: "http://127.0.0.1:7070", CheckedAtUnixMs: 1700000000000},
		Preflight: &nodev1.PreflightHealth{State: "failed", Generation: 4, AtUnixMs: 1700000000500, FailedChecks: []string{"a: b"}, Warnings: 2},
	})
	if !h.Socket.Serving || h.Socket.CheckedAt.UnixMilli() != 1700000000000 || h.Preflight.Generation != 4 ||
		h.Preflight.At.UnixMilli() != 1700000000500 || h.Preflight.FailedChecks[0] != "a: b" || h.Preflight.Warnings != 2 {
		t.Fatalf("converted %+v", h)
	}
	if h := healthFromProto(&nodev1.NodeHealth{}); h.Preflight.State != PrepNone || h.Socket.Serving || !h.Preflight.At.IsZero() {
		t.Fatalf("empty health: %+v", h)
	}
}

func TestHealthProblems(t *testing.T) {
	cases := []struct {
		name   string
		h      *NodeHealth
		gen    int
		count  int      // problems expected
		expect []string // substrings of them
	}{
		{"healthy", health(true, PrepPassed, 3), 3, 0, nil},
		{"socket only, no bootstrap", health(true, PrepNone, 0), 0, 0, nil},
		{"not reported", nil, 3, 1, []string{"reports no health"}},
		{"socket down", health(false, PrepPassed, 3), 3, 1, []string{"does not answer (connection refused)", "cube-node Pod"}},
		{"old generation", health(true, PrepPassed, 2), 3, 1, []string{"generation 2, want 3", "--generation=3"}},
		{"failed", health(true, PrepFailed, 3, "network.port-range: in use"), 3, 1, []string{"generation 3 failed", "network.port-range: in use", "cube-node-bootstrap"}},
		{"none", health(true, PrepNone, 0), 1, 1, []string{"no preflight fingerprint"}},
		{"invalid", health(true, PrepInvalid, 3), 3, 1, []string{"unreadable"}},
		{"both", health(false, PrepFailed, 3, "x: y"), 3, 2, []string{"does not answer", "failed"}},
	}
	for _, c := range cases {
		got := NodeStatus{ID: "n1", Version: "v0.5.0", State: StateReady, Health: c.h}.HealthProblems(c.gen)
		if len(got) != c.count {
			t.Errorf("%s: problems %q, want %d", c.name, got, c.count)
			continue
		}
		all := strings.Join(got, "\n")
		for _, want := range c.expect {
			if !strings.Contains(all, want) || !strings.Contains(all, "node n1") {
				t.Errorf("%s: %q lacks %q", c.name, all, want)
			}
		}
	}
}

func TestCheckNodes(t *testing.T) {
	nodes := []NodeStatus{
		{ID: "a", State: StateReady, Health: health(true, PrepPassed, 2)},
		{ID: "b", State: StateDown, Health: health(false, PrepFailed, 2)},
		{ID: "c", State: StateReady, Health: health(true, PrepPassed, 1)},
	}
	c := CheckNodes(nodes, 2)
	if c.OK() || c.Ready != 2 || len(c.Healthy) != 1 || len(c.Skipped) != 1 || len(c.Problems) != 1 ||
		!strings.Contains(c.Problems[0], "node c") || !strings.Contains(c.Healthy[0], "generation 2 passed") {
		t.Fatalf("check: %+v", c)
	}
	if c := CheckNodes(nodes[:2], 2); !c.OK() {
		t.Fatalf("only a Ready and healthy: %+v", c)
	}
	if c := CheckNodes(nodes[1:2], 0); c.OK() || c.Ready != 0 {
		t.Fatalf("no Ready node must fail: %+v", c)
	}
}

func TestHealthSummary(t *testing.T) {
	var none *NodeHealth
	for h, want := range map[*NodeHealth]string{
		none:                                 "-",
		health(true, PrepPassed, 3):          "ok gen 3",
		health(false, PrepFailed, 3, "x: y"): "FAIL gen 3 failed",
		health(true, PrepNone, 0):            "ok none",
	} {
		if got := h.Summary(); got != want {
			t.Errorf("summary %q, want %q", got, want)
		}
	}
}
