package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/store"
)

// killOnlyNode answers the node protocol's kill; every other call of it is
// unimplemented.
type killOnlyNode struct {
	nodeapi.Cubelet // nil: other calls panic (not made here)
}

func (killOnlyNode) KillSandbox(context.Context, string) error { return nil }

// A kill gives its sandbox's capacity back at once: on a node full up, a
// create right after a kill (before any heartbeat) finds room. Before, the
// kill recounted from the table while the master had not yet deleted the
// record, so the node stayed full until its next heartbeat.
func TestKillFreesCapacityAtOnce(t *testing.T) {
	r, st, _ := newTestRegistry(t)
	r.cfg.Connect = func(NodeRecord) *nodeapi.Client {
		return nodeapi.NewInProcessClient(killOnlyNode{}, func(context.Context) (*nodev1.NodeInfo, error) { return &nodev1.NodeInfo{}, nil })
	}
	ctx := context.Background()
	n := rec("n1", "v0.5.0")
	n.Capacity.MaxSandboxes = 2
	if err := r.Register(ctx, n); err != nil {
		t.Fatal(err)
	}
	req := Request{Template: "base", CPU: 2, MemoryMB: 512}
	create := func(id string) error {
		_, _, release, err := r.reserve(id, req, supply{})
		if err != nil {
			return err
		}
		release(true)
		now := time.Now()
		return st.CreateSandbox(ctx, store.Sandbox{ID: id, TemplateID: "base", NodeID: "n1", StartedAt: now, EndAt: now.Add(time.Hour),
			State: store.StateRunning, CPUCount: 2, MemoryMB: 512, EnvdVersion: "0.5.7", EnvdAccessToken: "x"})
	}
	kill := func(id string) error { // as the master does
		if err := r.KillSandbox(ctx, id); err != nil {
			return err
		}
		return st.DeleteSandbox(ctx, id)
	}
	for i := range 2 {
		if err := create(fmt.Sprint("sb", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := create("over"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third create on a node for 2: %v", err)
	}
	for i := range 20 {
		if err := kill(fmt.Sprint("sb", i)); err != nil {
			t.Fatal(err)
		}
		if err := create(fmt.Sprint("sb", i+2)); err != nil {
			t.Fatalf("create %d right after a kill: %v", i, err)
		}
	}
	got, _ := r.Node("n1")
	if got.Sandboxes != 2 || got.UsedCPU != 4 || got.UsedMemoryMB != 1024 {
		t.Errorf("after 20 kills and creates: %+v", got)
	}
	// The next recount from the table agrees.
	if err := r.recount(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ := r.Node("n1"); again.Sandboxes != got.Sandboxes || again.UsedCPU != got.UsedCPU {
		t.Errorf("recount: %+v, kills left %+v", again, got)
	}
}
