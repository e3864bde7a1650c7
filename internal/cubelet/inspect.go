package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/shim"
	"github.com/cube-dev/cube/internal/template"
)

// Mapping statuses reported by Inspect. StatusOrphan is the only place the
// word "orphan" appears in a mapping listing, so operators can count them.
const (
	StatusOwned    = "owned"    // owner record live and matching
	StatusOrphan   = "orphan"   // no live owner
	StatusConflict = "conflict" // owner live but its record disagrees
)

// Record sources reported by Inspect.
const (
	SourceStore     = "node-store"
	SourceStateDirs = "state-dirs"
)

// MappingStatus is one kernel host-port mapping and what its owner says.
type MappingStatus struct {
	HostPort  uint16 `json:"hostPort"`
	SandboxIP string `json:"sandboxIP"`
	GuestPort uint16 `json:"guestPort"`
	Owner     string `json:"owner"`
	Status    string `json:"status"`
	Detail    string `json:"detail,omitempty"`
}

// Finding kinds reported by Inspect besides mappings.
const (
	FindingEndpoint       = "endpoint"        // netns pin or veth with no live owner
	FindingStateDir       = "state-dir"       // sandbox state dir with no live owner
	FindingCgroup         = "cgroup"          // sandbox cgroup with no live owner
	FindingDeadShim       = "dead-shim"       // record says running, shim does not answer
	FindingHalfMade       = "half-made"       // record creating/deleting, shim gone
	FindingBadRecord      = "bad-record"      // record that cannot be decoded
	FindingMissingMapping = "missing-mapping" // live owner's mapping absent from the kernel
)

// Finding is a piece of node state that needs attention. Status is
// StatusOrphan for objects without a live owner, "problem" otherwise.
type Finding struct {
	Kind   string `json:"kind"`
	Status string `json:"status"`
	Object string `json:"object"`
	Detail string `json:"detail,omitempty"`
}

// Inspection is a read-only view of a node: owner records against kernel
// objects. Inspect builds it without changing anything.
type Inspection struct {
	// Source says where owner records were read from; Note says why when
	// they did not come from the node store.
	Source string `json:"source"`
	Note   string `json:"note,omitempty"`
	// Dataplane is false when no dataplane is pinned (Cube never started,
	// or it was destroyed on a clean stop).
	Dataplane bool            `json:"dataplane"`
	Mappings  []MappingStatus `json:"mappings"`
	Findings  []Finding       `json:"findings"`
	// Live lists the sandboxes with an owner record and an answering shim.
	Live []string `json:"live"`
	// Runtime is what the node starts sandboxes with (RuntimeFile; nil
	// when no cubelet of this version has started on it), Supervisors the
	// live supervisors, with their versions (versions.go).
	Runtime     *RuntimeInfo       `json:"runtime,omitempty"`
	Supervisors []SupervisorStatus `json:"supervisors"`
}

// shimTimeout bounds the liveness probe of one shim.
const shimTimeout = 2 * time.Second

// Inspect reads the node described by cfg (state dir, dataplane, cgroup
// parent) and classifies every mapping and every other piece of sandbox
// state by its owner. It creates and changes nothing. While a cubelet holds
// the node store, owner records are read from the per-sandbox copies in the
// state dirs instead (Source says which).
func Inspect(ctx context.Context, cfg Config) (*Inspection, error) {
	in := &Inspection{Mappings: []MappingStatus{}, Findings: []Finding{}}
	recs, err := loadRecords(cfg, in)
	if err != nil {
		return nil, err
	}
	// live is keyed by sandbox (and slot) id, which names mappings; liveRT
	// by runtime name, which names endpoints, state dirs and cgroups (a
	// record's Runtime(): a slot's id for a sandbox made from a pre-started
	// slot).
	live, liveRT := map[string]bool{}, map[string]bool{}
	for id, r := range recs {
		alive := r.State == nodestore.StatePooled && r.Template == "" // a plain warm-pool slot: owned by the pool, no shim
		if !alive {
			alive = probeShim(ctx, cfg, r.Runtime())
		}
		switch {
		case alive:
			live[id], liveRT[r.Runtime()] = true, true
		case r.State == nodestore.StatePooled:
			in.add(FindingDeadShim, "problem", "pool slot "+id, "pre-started slot's sandbox does not run; reconcile drops the slot")
		case r.State == nodestore.StateRunning:
			in.add(FindingDeadShim, "problem", "sandbox "+id, "record says running but the shim does not answer; reconcile reaps it")
		default:
			in.add(FindingHalfMade, "problem", "sandbox "+id, fmt.Sprintf("record is %s and no shim runs; reconcile reaps it", r.State))
		}
	}
	stateIDs := stateDirIDs(cfg)
	for _, name := range stateIDs {
		if !liveRT[name] && in.Source == SourceStateDirs && probeShim(ctx, cfg, name) {
			// A create in progress: its record.json is written once it runs.
			liveRT[name] = true
			if !isSlot(name) {
				live[name] = true
			}
		}
	}
	for id := range live {
		in.Live = append(in.Live, id)
	}
	sort.Strings(in.Live)
	inspectSupervisors(cfg, in, recs, live, liveRT)

	if err := inspectDataplane(ctx, cfg, in, recs, live, liveRT); err != nil {
		return nil, err
	}
	for _, name := range stateIDs {
		if !liveRT[name] {
			in.add(FindingStateDir, StatusOrphan, filepath.Join(cfg.sandboxesDir(), name), "no live owner")
		}
	}
	if ids, err := cgroup.List(cfg.cgroupParent()); err == nil {
		for _, name := range ids {
			if validID(name) && !liveRT[name] {
				in.add(FindingCgroup, StatusOrphan, cfg.cgroupParent()+"/"+name, "no live owner")
			}
		}
	}
	return in, nil
}

func (in *Inspection) add(kind, status, object, detail string) {
	in.Findings = append(in.Findings, Finding{Kind: kind, Status: status, Object: object, Detail: detail})
}

// Problems counts the findings plus the mappings that are not owned.
func (in *Inspection) Problems() int {
	n := len(in.Findings)
	for _, m := range in.Mappings {
		if m.Status != StatusOwned {
			n++
		}
	}
	return n
}

// inspectDataplane classifies mappings (owned by sandbox ids, live) and
// endpoints (owned by runtime names, liveRT: a pre-started slot's endpoint
// keeps the slot's name).
func inspectDataplane(ctx context.Context, cfg Config, in *Inspection, recs map[string]nodestore.Sandbox, live, liveRT map[string]bool) error {
	dp, err := cubevs.OpenExisting(ctx, cfg.Network)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open dataplane: %w", err)
	}
	defer dp.Close()
	in.Dataplane = true
	maps, err := dp.Mappings(ctx)
	if err != nil {
		return fmt.Errorf("read mappings: %w", err)
	}
	// Mappings are owned by runtime names (a pre-started slot's id for a
	// sandbox made from it).
	byRT := make(map[string]nodestore.Sandbox, len(recs))
	for _, r := range recs {
		byRT[r.Runtime()] = r
	}
	present := map[uint16]bool{}
	for _, m := range maps {
		present[m.HostPort] = true
		ms := classifyMapping(m, byRT, liveRT)
		if r, ok := byRT[m.Owner]; ok && r.ID != m.Owner && ms.Detail == "" {
			ms.Detail = "sandbox " + r.ID
		}
		in.Mappings = append(in.Mappings, ms)
	}
	for id := range live {
		r, ok := recs[id]
		if !ok {
			continue
		}
		for guest, hp := range r.Ports {
			if !present[hp] {
				in.add(FindingMissingMapping, "problem", fmt.Sprintf("host port %d", hp),
					fmt.Sprintf("sandbox %s guest port %d is not mapped; reconcile repairs it", id, guest))
			}
		}
	}
	eps, err := dp.Endpoints(ctx)
	if err != nil {
		return fmt.Errorf("read endpoints: %w", err)
	}
	for _, ep := range eps {
		if !live[ep.Owner] && !liveRT[ep.Owner] {
			obj := ep.NetNSPath
			if obj == "" {
				obj = "link " + ep.LinkName
			}
			in.add(FindingEndpoint, StatusOrphan, obj, "no live owner ("+ep.Owner+")")
		}
	}
	return nil
}

// classifyMapping decides a mapping's status from its owner's record and
// liveness (both keyed by the owner's runtime name); it is the pure core of
// mapdump.
func classifyMapping(m cubevs.Mapping, recs map[string]nodestore.Sandbox, live map[string]bool) MappingStatus {
	ms := MappingStatus{HostPort: m.HostPort, SandboxIP: m.SandboxIP.String(), GuestPort: m.GuestPort, Owner: m.Owner}
	r, ok := recs[m.Owner]
	switch {
	case !live[m.Owner] && !ok:
		ms.Status, ms.Detail = StatusOrphan, "no owner record"
	case !live[m.Owner]:
		ms.Status, ms.Detail = StatusOrphan, "owner's shim is not running"
	case !ok:
		// Live shim, record not yet written (create in progress).
		ms.Status, ms.Detail = StatusOwned, "owner is being created"
	case r.Ports[m.GuestPort] != m.HostPort:
		ms.Status = StatusConflict
		ms.Detail = fmt.Sprintf("owner record maps guest port %d to host port %d", m.GuestPort, r.Ports[m.GuestPort])
	case r.IP != m.SandboxIP:
		ms.Status = StatusConflict
		ms.Detail = fmt.Sprintf("owner record has sandbox IP %s", r.IP)
	default:
		ms.Status = StatusOwned
	}
	return ms
}

// loadRecords reads owner records from the node store, or from the state
// dirs' record.json copies when the store is held by a running cubelet or
// missing.
func loadRecords(cfg Config, in *Inspection) (map[string]nodestore.Sandbox, error) {
	out := map[string]nodestore.Sandbox{}
	path := cfg.storePath()
	locked, err := StoreLocked(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		in.Source, in.Note = SourceStateDirs, "node store "+path+" does not exist; owner records read from the state dirs"
	case err != nil:
		return nil, err
	case locked:
		in.Source, in.Note = SourceStateDirs, "node store "+path+" is held by a running cubelet; owner records read from the state dirs (creates in progress may be missing)"
	}
	if in.Source == SourceStateDirs {
		for _, name := range stateDirIDs(cfg) {
			data, err := os.ReadFile(filepath.Join(cfg.sandboxesDir(), name, recordFile))
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			var r nodestore.Sandbox
			if err != nil || json.Unmarshal(data, &r) != nil || r.Runtime() != name || !validID(r.ID) {
				in.add(FindingBadRecord, "problem", filepath.Join(cfg.sandboxesDir(), name, recordFile), "unreadable owner record copy")
				continue
			}
			out[r.ID] = r
		}
		// Warm-pool slots keep their record copy next to their disk image.
		slots, _ := filepath.Glob(filepath.Join(cfg.StateDir, "pool", poolPrefix+"*.json"))
		for _, f := range slots {
			var r nodestore.Sandbox
			if data, err := os.ReadFile(f); err == nil && json.Unmarshal(data, &r) == nil && isSlot(r.ID) {
				out[r.ID] = r
			}
		}
		return out, nil
	}
	in.Source = SourceStore
	st, err := nodestore.Open(path)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	recs, bad := st.List()
	for _, r := range recs {
		out[r.ID] = r
	}
	for _, k := range bad {
		in.add(FindingBadRecord, "problem", "record "+k, "undecodable record in the node store; remove it after checking the sandbox")
	}
	return out, nil
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

// GC removes orphans and reaps dead sandboxes the way the start-up
// reconcile does. It refuses while a cubelet holds the node store (a live
// cubelet reconciles itself) and when no dataplane is pinned.
func GC(ctx context.Context, cfg Config) (ReconcileReport, error) {
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = cgroup.DefaultParent
	}
	if locked, err := StoreLocked(cfg.storePath()); err == nil && locked {
		return ReconcileReport{}, fmt.Errorf("node store %s is held by a running cubelet, which reconciles the node itself; stop it first: %w",
			cfg.storePath(), errdefs.ErrFailedPrecondition)
	}
	if err := os.MkdirAll(cfg.sandboxesDir(), 0o700); err != nil {
		return ReconcileReport{}, fmt.Errorf("create state dir: %w", err)
	}
	dp, err := cubevs.OpenExisting(ctx, cfg.Network)
	if err != nil {
		return ReconcileReport{}, fmt.Errorf("open dataplane: %w", err)
	}
	store, err := nodestore.Open(cfg.storePath())
	if err != nil {
		dp.Close()
		return ReconcileReport{}, err
	}
	c := newCubelet(cfg, nil, dp, store)
	defer c.Close()
	return c.Reconcile(ctx)
}

// newCubelet assembles a cubelet around open handles without the start-up
// checks and reconcile of New (used by GC).
func newCubelet(cfg Config, templates *template.Registry, dp *cubevs.Dataplane, store *nodestore.Store) *Cubelet {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Cubelet{
		cfg: cfg, log: cfg.Logger, templates: templates, dp: dp, store: store, shimExe: cfg.Exe,
		locks:         map[string]*idLock{},
		reservedIPs:   map[netip.Addr]bool{},
		reservedPorts: map[uint16]bool{},
	}
}

// liveness is what a probe of a sandbox's shim found.
type liveness int

const (
	// livenessUnknown: no answer within shimTimeout, the probe was
	// cancelled, or the shim's record is unreadable. Nothing may be torn
	// down on it: a busy or stopped shim still holds a live sandbox.
	livenessUnknown liveness = iota
	livenessAlive
	// livenessDead: no shim process (or none was ever recorded), or the
	// shim reports that its sandbox ended.
	livenessDead
)

// probeLiveness asks the shim of the state dir for its sandbox's state.
func probeLiveness(ctx context.Context, stateDir string) liveness {
	l, watch := probeLivenessWatch(ctx, stateDir)
	if watch != nil {
		watch.Close()
	}
	return l
}

// probeLivenessWatch is probeLiveness that also returns, for a shim found
// alive, a watch on its process (nil if it could not be made).
func probeLivenessWatch(ctx context.Context, stateDir string) (liveness, *shim.ExitWatch) {
	ctx, cancel := context.WithTimeout(ctx, shimTimeout)
	defer cancel()
	gone := func(err error) bool { return errors.Is(err, errdefs.ErrNotFound) && ctx.Err() == nil }
	sb, err := nsrt.Attach(ctx, stateDir)
	if err != nil {
		if gone(err) {
			return livenessDead, nil
		}
		return livenessUnknown, nil
	}
	defer sb.Close()
	if !sb.AttachState().Running { // Attach asked the shim already
		return livenessDead, nil
	}
	watch, _ := sb.ExitWatch()
	return livenessAlive, watch
}

// shimAliveIn reports whether the shim of the state dir answers and its
// sandbox runs.
func shimAliveIn(ctx context.Context, stateDir string) bool {
	return probeLiveness(ctx, stateDir) == livenessAlive
}

// probeShim probes the shim of the runtime called name (bounded by
// shimTimeout, see probeLiveness).
func probeShim(ctx context.Context, cfg Config, name string) bool {
	return shimAliveIn(ctx, filepath.Join(cfg.sandboxesDir(), name))
}

func stateDirIDs(cfg Config) []string {
	return (&Cubelet{cfg: cfg}).stateDirIDs()
}

func (cfg Config) storePath() string { return filepath.Join(cfg.StateDir, "node.db") }

func (cfg Config) cgroupParent() string {
	if cfg.CgroupParent == "" {
		return cgroup.DefaultParent
	}
	return cfg.CgroupParent
}
