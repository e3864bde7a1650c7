package cubelet

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentKills kills many sandboxes at once, as a burst's teardown
// does: every kill succeeds, nothing is left behind (records, state dirs,
// mappings, egress chains, links and netns pins, cgroups), and the same ids are created
// again at once (no name, address or port is still held).
func TestConcurrentKills(t *testing.T) {
	n := newTestNode(t)
	n.cfg.PoolSize = 0
	c := n.start(t)
	ctx := context.Background()
	const count = 16
	for round := range 2 {
		if err := createMany(ctx, c, count); err != nil {
			t.Fatalf("round %d: create: %v", round, err)
		}
		var wg sync.WaitGroup
		errs := make([]error, count)
		gate := make(chan struct{})
		for i := range count {
			wg.Go(func() {
				<-gate
				errs[i] = c.KillSandbox(ctx, fmt.Sprintf("bench-%04d", i))
			})
		}
		close(gate)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d: kill bench-%04d: %v", round, i, err)
			}
		}
		assertClean(t, c)
		if owners, err := c.dp.EgressOwners(ctx); err != nil || len(owners) > 0 {
			t.Errorf("round %d: egress chains left: %v %v", round, owners, err)
		}
		if t.Failed() {
			return
		}
	}
}
