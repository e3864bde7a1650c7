package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/sandboxlog"
	"github.com/cube-dev/cube/internal/store"
)

// logsOnlyNode serves sandbox logs from a real store; every other call of
// the node protocol is unimplemented.
type logsOnlyNode struct {
	nodeapi.Cubelet // nil: other calls panic (not made here)
	logs            *sandboxlog.Store
}

func (n logsOnlyNode) SandboxLogs(_ context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error) {
	return n.logs.Read(id, q)
}

func TestSandboxLogsAskTheSandboxsNodeOrAllNodes(t *testing.T) {
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	stores := map[string]*sandboxlog.Store{}
	for _, id := range []string{"n1", "n2"} {
		if stores[id], err = sandboxlog.Open(sandboxlog.Config{Dir: t.TempDir()}); err != nil {
			t.Fatal(err)
		}
	}
	connect := func(rec NodeRecord) *nodeapi.Client {
		return nodeapi.NewInProcessClient(logsOnlyNode{logs: stores[rec.ID]}, func(context.Context) (*nodev1.NodeInfo, error) { return &nodev1.NodeInfo{}, nil })
	}
	r := NewRegistry(Config{ServerVersion: "v0.5.0", Connect: connect}, DocumentNodes{Docs: st}, st)
	ctx := context.Background()
	for _, id := range []string{"n1", "n2"} {
		if err := r.Register(ctx, rec(id, "v0.5.0")); err != nil {
			t.Fatal(err)
		}
	}
	line := func(msg string) nodeproto.LogEntry {
		return nodeproto.LogEntry{Time: time.Now(), Level: "info", Logger: "cubelet", Message: msg}
	}
	// "running" runs on n2 (the store says so); "ended" ran on n1 and is
	// forgotten by the store; "both" has logs on both nodes but runs on n2.
	stores["n2"].Append("running", line("on n2"))
	stores["n1"].Append("ended", line("ended on n1"))
	stores["n1"].Append("both", line("stale on n1"))
	stores["n2"].Append("both", line("live on n2"))
	for _, id := range []string{"running", "both"} {
		if err := st.CreateSandbox(ctx, store.Sandbox{ID: id, TemplateID: "base", NodeID: "n2", StartedAt: time.Now(), EndAt: time.Now().Add(time.Hour),
			State: store.StateRunning, CPUCount: 2, MemoryMB: 512, EnvdVersion: "0.5.7", EnvdAccessToken: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]string{"running": "on n2", "ended": "ended on n1", "both": "live on n2"} {
		got, err := r.SandboxLogs(ctx, id, nodeproto.LogQuery{})
		if err != nil || len(got) != 1 || got[0].Message != want {
			t.Errorf("%s: %+v %v, want %q", id, got, err, want)
		}
	}
	if _, err := r.SandboxLogs(ctx, "unknown", nodeproto.LogQuery{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: %v, want NotFound", err)
	}
	// A Down node is not asked.
	r.mu.Lock()
	r.nodes["n1"].down = true
	r.mu.Unlock()
	if _, err := r.SandboxLogs(ctx, "ended", nodeproto.LogQuery{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ended sandbox on a Down node: %v, want NotFound", err)
	}
}
