package cubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// Offline operations work on a node whose cubelet is not running: GC (what
// the start-up reconcile does) and Cleanup (remove everything, for
// uninstalls). Both open the node through openOffline; Inspect (doctor,
// mapdump) only reads and never needs the lock.

// GC removes orphans and dead sandboxes the way the start-up
// reconcile does. It refuses while a cubelet holds the node store (a live
// cubelet reconciles itself) and when no dataplane is pinned.
func GC(ctx context.Context, cfg Config) (ReconcileReport, error) {
	c, err := openOffline(ctx, cfg, "which reconciles the node itself; stop it first", cubevs.OpenExisting)
	if err != nil {
		return ReconcileReport{}, err
	}
	defer c.Close()
	return c.Reconcile(ctx)
}

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
	// The dataplane is adopted (or recreated) so its pieces can be removed.
	c, err := openOffline(ctx, cfg, "stop it (or delete its Pod) first", cubevs.Open)
	if err != nil {
		return rep, err
	}
	defer c.Close()
	store := c.store
	// Pool slots are listed before the reconcile, which drops the slots it
	// cannot keep; sandboxes after it, so dead ones it removes are not
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

// openOffline opens a node for an offline operation: it refuses while a
// cubelet holds the node store (hint says what to do), then opens the
// dataplane with openDP and the store, and assembles a cubelet around
// them without New's start-up checks and reconcile.
func openOffline(ctx context.Context, cfg Config, hint string, openDP func(context.Context, cubevs.Config) (*cubevs.Dataplane, error)) (*Cubelet, error) {
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = cgroup.DefaultParent
	}
	if locked, err := StoreLocked(cfg.storePath()); err == nil && locked {
		return nil, fmt.Errorf("node store %s is held by a running cubelet, %s: %w", cfg.storePath(), hint, errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(cfg.sandboxesDir(), 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	dp, err := openDP(ctx, cfg.Network)
	if err != nil {
		return nil, fmt.Errorf("open dataplane: %w", err)
	}
	store, err := nodestore.Open(cfg.storePath())
	if err != nil {
		dp.Close()
		return nil, err
	}
	return newCubelet(cfg, nil, dp, store), nil
}

// StoreLocked reports whether the node store at path is held by another
// process (a running cubelet holds bbolt's exclusive lock). A missing
// store yields an error wrapping fs.ErrNotExist.
func StoreLocked(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", path, err)
	}
	return false, unix.Flock(int(f.Fd()), unix.LOCK_UN)
}

// newCubelet assembles a cubelet around open handles without the start-up
// checks and reconcile of New (used by GC).
func newCubelet(cfg Config, templates *template.Registry, dp *cubevs.Dataplane, store *nodestore.Store) *Cubelet {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Cubelet{
		cfg: cfg, log: cfg.Logger, templates: templates, dp: dp, store: store, shimExe: cfg.Exe,
		locks:   map[string]*idLock{},
		addrs:   newAddrs(cfg.Network, store),
		metrics: newMetrics(),
		disks:   nsrt.NewDiskCache(filepath.Join(cfg.StateDir, "disks")),
	}
}
