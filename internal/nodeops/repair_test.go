package nodeops

import (
	"testing"

	"github.com/cube-dev/cube/internal/cubelet"
)

// TestCleanupSummary: the pool slots a cleanup removes are counted apart
// from user sandboxes (a node whose sandboxes were drained still had its
// pool, and reported "0 sandboxes killed" for 4 slots killed).
func TestCleanupSummary(t *testing.T) {
	got := cleanupSummary(cubelet.CleanupReport{PoolSlots: []string{"p1", "p2", "p3", "p4"}, Dataplane: true})
	if want := "cleanup: 0 sandboxes killed, 4 pool slots removed, dataplane removed: true, state removed: false"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}
