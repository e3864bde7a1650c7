// Package cubelet is Cube's node agent. It creates and destroys sandboxes by
// composing the template registry, CubeVS networking and the namespace
// runtime, and records every piece of kernel state it makes in the node
// store first, so that a restart can re-adopt live sandboxes and sweep
// orphans (see Reconcile).
package cubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/exepath"
	"github.com/cube-dev/cube/internal/ipam"
	"github.com/cube-dev/cube/internal/mountns"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/version"
	"golang.org/x/sync/semaphore"
)

// EnvdPort is the port envd listens on inside every sandbox.
const EnvdPort = 49983

// DefaultPoolTemplate is the template pre-started pool slots run.
const DefaultPoolTemplate = "base"

// Config configures a cubelet.
type Config struct {
	// StateDir holds the node store and one state directory per sandbox.
	StateDir string
	// Exe is the cube binary re-executed as `cube shim` per sandbox.
	Exe string
	// EnvdPath is the host path of the static envd binary injected into sandboxes.
	EnvdPath string
	// ReaperPath is the host path of the static cube-reaper binary that
	// runs as each sandbox's pid 1. Empty: ReaperName next to EnvdPath if
	// that exists, else envd reaps for itself (one more envd-sized process
	// per sandbox).
	ReaperPath string
	// EnvdVersion is the protocol version the injected envd implements.
	EnvdVersion string
	// CgroupParent is the cgroup under which sandbox cgroups are made.
	CgroupParent string
	// NoDiskLimit leaves the writable layer unlimited instead of putting it
	// on a per-sandbox filesystem of the template's disk size.
	NoDiskLimit bool
	// OnDead is told about each sandbox found dead (its supervisor gone)
	// and removed while the cubelet runs (sweepDead); the all-in-one server
	// forgets it. In cluster mode the next heartbeat carries the news
	// instead.
	OnDead func(id string) `json:"-"`
	// MaintainInterval is how often dead sandboxes are swept
	// (default DefaultMaintainInterval; negative disables).
	MaintainInterval time.Duration
	// PoolSize is how many pre-provisioned slots the warm pool keeps
	// (0 disables it: every create is cold; PoolAdaptive sizes it by
	// demand within PoolMemoryMB, see pooldemand.go).
	PoolSize int
	// PoolMemoryMB is the adaptive pool's memory budget (0:
	// DefaultPoolMemoryMB of the host's memory); unused at a fixed size.
	PoolMemoryMB int64
	// PoolFloor is what the adaptive pool keeps with no demand, within
	// PoolMemoryMB (0: DefaultPoolFloor); unused at a fixed size.
	PoolFloor int
	// PoolPrestart makes slots pre-started sandboxes of PoolTemplate (see
	// pool.go); false keeps plain slots (IP + netns + veth + disk image).
	PoolPrestart bool
	// CreateParallelism is how many creates run at once; the others wait
	// their turn in arrival order (0: DefaultCreateParallelism; negative:
	// no limit). A burst of creates shares the node's CPUs: run all at once,
	// every one of them finishes near the end of the burst; in turns, the
	// first finish early and the last no later.
	CreateParallelism int
	// PoolTemplate is the template pre-started slots run
	// (default DefaultPoolTemplate).
	PoolTemplate string
	// StartTimeout bounds the wait for a template's ready command at
	// create (default DefaultStartTimeout; see startcmd.go).
	StartTimeout time.Duration
	// PoolTemplates are pre-started slots of other templates, kept beside
	// the PoolSize slots of PoolTemplate (see pooltargets.go); they need
	// PoolPrestart, and PoolSize 0 (no warm pool) drops them too.
	PoolTemplates []PoolTarget
	// UserNS chooses whether sandboxes run in a user namespace (root inside
	// is an unprivileged host id): auto (the default, ""), on or off; see
	// nsrt.ResolveUserNS.
	UserNS nsrt.UserNSMode
	// SeccompLog installs sandbox filters in log mode: the kernel logs each
	// refused syscall and the cubelet logs it with the sandbox's id (see
	// watchSeccomp and docs/security.md).
	SeccompLog bool
	// Network configures CubeVS.
	Network cubevs.Config
	// Logger receives the cubelet's logs.
	Logger *slog.Logger
	// Fetcher, when set, pulls templates the node lacks from the server.
	Fetcher TemplateFetcher `json:"-"`
	// HostMountNS chooses the mount namespace shims start in, and with it
	// where every supervisor and sandbox lives (see runtime.go):
	// HostMountNSAuto (the default, also "") the host's when the cubelet
	// runs in a container whose mount namespace differs from it,
	// HostMountNSOff the cubelet's own, anything else the path of a mount
	// namespace file (/proc/<pid>/ns/mnt of a host process).
	HostMountNS string
	// Version is the cubelet's version, part of the runtime stamp that
	// tells warm-pool slots of an earlier runtime (default version.Version).
	Version string
	// Logs bounds the sandbox logs the node keeps (sandboxlogs.go).
	Logs LogConfig
}

// Cubelet is the node agent.
type Cubelet struct {
	cfg       Config
	log       *slog.Logger
	templates *template.Registry
	dp        *cubevs.Dataplane
	store     *nodestore.Store

	// mu guards allocation decisions (IPs, host ports); the long
	// create/destroy steps run under the sandbox's own lock (see lock).
	mu sync.Mutex
	// locksMu guards locks, the per-sandbox locks held or waited for.
	locksMu sync.Mutex
	locks   map[string]*idLock
	// addrs are the free sets of sandbox IPs and host ports (addrs.go).
	addrs *ipam.Allocator
	// strayPorts are host ports mapped in the kernel without an owner
	// record after the last Reconcile (a sweep that failed), held in addrs;
	// reconciled says that one ran, so creates need not read the kernel's
	// mappings (see allocate).
	strayPorts map[uint16]bool
	reconciled bool

	// watches and probes: see livenessOf (liveness.go).
	watches shimWatches
	probes  atomic.Int64
	// turns admits creates, CreateParallelism at a time (nil: no limit).
	turns    *semaphore.Weighted
	pool     pool
	stopPool context.CancelFunc
	// shimNS is the mount namespace shims start in (nil: the cubelet's
	// own), shimExe the binary they run; runtime is the current
	// RuntimeInfo (see runtime.go).
	shimNS    *mountns.NS
	shimExe   string
	runtime   atomic.Pointer[RuntimeInfo]
	metrics   *metrics        // see RegisterMetrics
	logs      *sandboxLogs    // nil: no sandbox logs (offline tools)
	disks     *nsrt.DiskCache // formatted disk images to copy (steps.go: makeDisk)
	closeOnce sync.Once
	closeErr  error
}

// New opens the node store and the dataplane, then reconciles the node
// before returning, so the cubelet serves only a node whose state it owns.
func New(ctx context.Context, cfg Config, templates *template.Registry) (*Cubelet, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "cube"
	}
	if cfg.Version == "" {
		cfg.Version = version.Version
	}
	if err := validatePoolTargets(cfg); err != nil {
		return nil, err
	}
	if anyAdaptive(cfg) && cfg.PoolMemoryMB == 0 {
		cfg.PoolMemoryMB = DefaultPoolMemoryMB(hostMemoryMB())
	}
	if cfg.PoolFloor <= 0 {
		cfg.PoolFloor = DefaultPoolFloor
	}
	switch {
	case cfg.PoolSize == 0:
		cfg.PoolTemplates = nil // no warm pool at all
	case !cfg.PoolPrestart && len(cfg.PoolTemplates) > 0:
		cfg.Logger.Info("warm pool: slots of other templates need pre-started slots; none kept", "templates", cfg.PoolTemplates)
		cfg.PoolTemplates = nil
	}
	if err := os.MkdirAll(cfg.sandboxesDir(), 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if _, err := os.Stat(cfg.EnvdPath); err != nil {
		return nil, fmt.Errorf("envd binary %s: %w (build it with `make build`)", cfg.EnvdPath, errdefs.ErrFailedPrecondition)
	}
	if cfg.ReaperPath == "" {
		if p, ok := exepath.Sibling(cfg.EnvdPath, ReaperName); ok {
			cfg.ReaperPath = p
		}
	} else if !exepath.Executable(cfg.ReaperPath) {
		return nil, fmt.Errorf("reaper binary %s: %w (build it with `make build`)", cfg.ReaperPath, errdefs.ErrFailedPrecondition)
	}
	store, err := nodestore.Open(filepath.Join(cfg.StateDir, "node.db"))
	if err != nil {
		return nil, err
	}
	dp, err := cubevs.Open(ctx, cfg.Network)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("open dataplane: %w", err)
	}
	c := newCubelet(cfg, templates, dp, store)
	c.pool = pool{kick: make(chan struct{}, 1), building: map[string]int{}, missing: map[string]time.Time{}}
	if c.anyAdaptive() {
		c.pool.demand = newDemand()
	}
	c.turns = newTurns(cfg.CreateParallelism)
	c.stopPool = func() {}
	if err := c.setUpRuntime(); err != nil {
		c.Close()
		return nil, fmt.Errorf("sandbox runtime: %w", err)
	}
	rep, err := c.reconcile(ctx, true) // supervisors are asked once serving: checkDeferred
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reconcile node: %w", err)
	}
	c.metrics.recordReconcile(rep)
	c.startLogs()
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	poolDone := make(chan struct{})
	// Stopping waits for a slot being made, so a shutdown that removes the
	// dataplane right after cannot race with it.
	checked := make(chan struct{})
	check := c.checkDeferred(rep)
	go func() { defer close(checked); check(bg) }()
	c.stopPool = func() { cancel(); <-poolDone; <-checked }
	if c.poolCapacity() > 0 {
		go func() { defer close(poolDone); c.runPool(bg) }()
	} else {
		close(poolDone)
	}
	if cfg.MaintainInterval == 0 {
		cfg.MaintainInterval = DefaultMaintainInterval
	}
	if cfg.MaintainInterval > 0 {
		go c.maintain(bg, cfg.MaintainInterval)
	}
	if cfg.SeccompLog {
		go c.watchSeccomp(bg)
	}
	return c, nil
}

// Close releases the store and dataplane handles; sandboxes keep running.
// It is idempotent.
func (c *Cubelet) Close() error {
	c.closeOnce.Do(func() {
		if c.stopPool != nil {
			c.stopPool()
		}
		c.stopLogs()
		c.closeErr = errors.Join(c.dp.Close(), c.store.Close())
		c.watches.closeAll()
		if c.shimNS != nil {
			c.shimNS.Close()
		}
	})
	return c.closeErr
}

func (cfg Config) sandboxesDir() string { return filepath.Join(cfg.StateDir, "sandboxes") }

// sandboxDir is the state dir of the runtime called name: a record's
// Runtime(), which is a pool slot's id for a sandbox made from a slot.
func (c *Cubelet) sandboxDir(name string) string { return filepath.Join(c.cfg.sandboxesDir(), name) }
