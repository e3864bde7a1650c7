package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/errdefs"
)

// A node's usage report, sent with its heartbeat through the
// RegistryService, reaches the scheduler: a node whose memory reserve is
// reached takes no sandbox, and the refusal names the flag.
func TestHeartbeatUsageReachesScheduler(t *testing.T) {
	r, _, _ := newTestRegistry(t)
	ctx := context.Background()
	nrec := rec("n1", "v0.5.0")
	nrec.Capacity = Capacity{MaxSandboxes: 500, MemoryReserveMB: 1000}
	if err := r.Register(ctx, nrec); err != nil {
		t.Fatal(err)
	}
	svc := NewRegistryService(r)
	beat := func(availMB int64) {
		t.Helper()
		_, err := svc.Heartbeat(ctx, connect.NewRequest(&nodev1.HeartbeatRequest{NodeId: "n1",
			Usage: &nodev1.NodeUsage{MemoryAvailableMb: availMB, SandboxResidentMb: 100, Sandboxes: 10, CpuUsedMilli: 250, Cpus: 2}}))
		if err != nil {
			t.Fatal(err)
		}
	}
	req := Request{Template: "base", CPU: 2, MemoryMB: 512}
	beat(5000)
	if st, _ := r.Node("n1"); st.Usage == nil || st.Usage.MemoryAvailableMB != 5000 || st.Usage.CPUUsedMilli != 250 {
		t.Fatalf("node status usage %+v", st.Usage)
	}
	if _, _, release, err := r.reserve("sb1", req, supply{}); err != nil {
		t.Fatalf("room by usage, 2 vCPU on no nominal capacity: %v", err)
	} else {
		release(false)
	}
	beat(1005)
	_, _, _, err := r.reserve("sb2", req, supply{})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "--memory-reserve-mb") {
		t.Fatalf("reserve reached: %v", err)
	}
}
