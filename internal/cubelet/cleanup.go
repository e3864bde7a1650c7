package cubelet

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
)

// CleanupReport says what Cleanup removed.
type CleanupReport struct {
	Sandboxes []string // sandboxes killed (gone from the node store)
	PoolSlots []string // warm-pool slots removed, counted apart: no user made them
	Dataplane bool     // cube-dp netns, host veth and nft tables removed
	StateDir  bool     // node state dir removed
}

// Cleanup removes everything Cube made on this node, for uninstalls: every
// sandbox (killed through its shim), warm-pool slots, the dataplane (netns
// pins, host veth, nft tables), the cgroup parents and, with purgeState,
// the node state dir. It refuses while a cubelet holds the node store.
func Cleanup(ctx context.Context, cfg Config, purgeState bool) (CleanupReport, error) {
	var rep CleanupReport
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = cgroup.DefaultParent
	}
	if locked, err := StoreLocked(cfg.storePath()); err == nil && locked {
		return rep, fmt.Errorf("node store %s is held by a running cubelet: stop it (or delete its Pod) first: %w",
			cfg.storePath(), errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(cfg.sandboxesDir(), 0o700); err != nil {
		return rep, err
	}
	dp, err := cubevs.Open(ctx, cfg.Network) // adopts (or recreates) it, so its pieces can be removed
	if err != nil {
		return rep, fmt.Errorf("open dataplane: %w", err)
	}
	store, err := nodestore.Open(cfg.storePath())
	if err != nil {
		dp.Close()
		return rep, err
	}
	c := newCubelet(cfg, nil, dp, store)
	defer c.Close()
	// Pool slots are listed before the reconcile, which drops the slots it
	// cannot keep; sandboxes after it, so dead ones it reaps are not
	// reported as killed.
	slotsBefore, _ := store.List()
	if _, err := c.Reconcile(ctx); err != nil {
		return rep, err
	}
	before, _ := store.List()
	var errs []error
	if err := c.KillAll(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := c.DestroyNetwork(ctx); err != nil { // drains the pool first
		errs = append(errs, err)
	} else {
		rep.Dataplane = true
	}
	// Report what is gone from the store, not what was meant to go: a kill
	// that failed is in errs, its sandbox not in the report.
	after, _ := store.List()
	left := map[string]bool{}
	for _, r := range after {
		left[r.ID] = true
	}
	for _, r := range slotsBefore {
		if r.State == nodestore.StatePooled && !left[r.ID] {
			rep.PoolSlots = append(rep.PoolSlots, r.ID)
		}
	}
	for _, r := range before {
		if r.State != nodestore.StatePooled && !left[r.ID] {
			rep.Sandboxes = append(rep.Sandboxes, r.ID)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rep, err
	}
	if purgeState {
		c.Close()
		if err := os.RemoveAll(cfg.StateDir); err != nil {
			return rep, fmt.Errorf("remove state dir: %w", err)
		}
		rep.StateDir = true
	}
	return rep, nil
}
