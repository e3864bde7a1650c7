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
	Sandboxes []string // sandboxes killed
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
	if _, err := c.Reconcile(ctx); err != nil {
		return rep, err
	}
	recs, _ := store.List()
	for _, r := range recs {
		if r.State != nodestore.StatePooled {
			rep.Sandboxes = append(rep.Sandboxes, r.ID)
		}
	}
	var errs []error
	if err := c.KillAll(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := c.DestroyNetwork(ctx); err != nil {
		errs = append(errs, err)
	} else {
		rep.Dataplane = true
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
