package nodeops

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/preflight"
)

// GC removes orphans and reaps dead sandboxes the way a cubelet's start-up
// reconcile does, and writes what it did. cubelet.GC refuses while a
// cubelet holds the node (it reconciles the node itself).
func GC(ctx context.Context, cfg cubelet.Config, w io.Writer) error {
	rep, err := cubelet.GC(ctx, cfg)
	if err != nil {
		return err
	}
	for _, o := range rep.Orphans {
		fmt.Fprintf(w, "removed orphan %s\n", o)
	}
	for _, id := range rep.Dead {
		fmt.Fprintf(w, "reaped sandbox %s\n", id)
	}
	if len(rep.Bad) > 0 {
		fmt.Fprintf(w, "left for an operator, undecodable records: %s\n", strings.Join(rep.Bad, " "))
	}
	_, err = fmt.Fprintf(w, "gc: %d removed, %d reaped, %d kept (%d records rebuilt), %d mappings repaired\n",
		len(rep.Orphans), len(rep.Dead), len(rep.Adopted), len(rep.Rebuilt), rep.Repaired)
	return err
}

// Cleanup uninstalls Cube from the node (cubelet.Cleanup: every sandbox,
// the pool, the dataplane, the cgroups and, with purgeState, the node
// state) and writes what it removed, also what was removed before a step
// failed. With purgeState it also releases the shared binds `cube kube
// share-mounts` made of the run and data dirs.
func Cleanup(ctx context.Context, cfg cubelet.Config, purgeState bool, w io.Writer) error {
	rep, err := cubelet.Cleanup(ctx, cfg, purgeState)
	for _, id := range rep.Sandboxes {
		fmt.Fprintf(w, "killed sandbox %s\n", id)
	}
	for _, id := range rep.PoolSlots {
		fmt.Fprintf(w, "removed pool slot %s\n", id)
	}
	if err != nil {
		return err
	}
	if purgeState {
		// The binds `cube kube share-mounts` made for the chart's
		// Bidirectional volumes (hosts whose / is private).
		released, err := preflight.ReleaseShared([]string{cfg.Network.RunDir, filepath.Dir(cfg.StateDir)})
		for _, d := range released {
			fmt.Fprintf(w, "unmounted the shared bind of %s\n", d)
		}
		if err != nil {
			return err
		}
	}
	_, err = fmt.Fprintln(w, cleanupSummary(rep))
	return err
}

// cleanupSummary is the last line of Cleanup's report: user sandboxes and
// warm-pool slots counted apart (a node with no sandbox still has its
// pool).
func cleanupSummary(rep cubelet.CleanupReport) string {
	return fmt.Sprintf("cleanup: %d sandboxes killed, %d pool slots removed, dataplane removed: %v, state removed: %v",
		len(rep.Sandboxes), len(rep.PoolSlots), rep.Dataplane, rep.StateDir)
}
