package cubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodestore"
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
	FindingDeadShim       = "dead-shim"       // record says running, shim gone
	FindingSilentShim     = "silent-shim"     // record says running, shim alive but does not answer
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
	// Live lists the sandboxes a reconcile would keep: an owner record and
	// a shim not known to be gone (liveness.go).
	Live []string `json:"live"`
	// Runtime is what the node starts sandboxes with (RuntimeFile; nil
	// when no cubelet of this version has started on it), Supervisors the
	// live supervisors, with their versions (versions.go).
	Runtime     *RuntimeInfo       `json:"runtime,omitempty"`
	Supervisors []SupervisorStatus `json:"supervisors"`
}

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
	// live is keyed by sandbox (and slot) id; liveRT by runtime name, which
	// names mappings, endpoints, state dirs and cgroups (a record's
	// Runtime(): the slot's id for a sandbox made from a pool slot).
	live, liveRT := map[string]bool{}, map[string]bool{}
	for id, r := range recs {
		l := livenessAlive // a plain warm-pool slot: owned by the pool, nothing runs
		if r.State != nodestore.StatePooled || r.Template != "" {
			l, _ = probe(ctx, filepath.Join(cfg.sandboxesDir(), r.Runtime()), false)
		}
		switch {
		case r.State == nodestore.StatePooled && l == livenessAlive:
			live[id], liveRT[r.Runtime()] = true, true
		case r.State == nodestore.StatePooled:
			in.add(FindingDeadShim, "problem", "pool slot "+id, "pre-started slot's sandbox does not run or answer; reconcile drops the slot")
		case keepRecord(r, l):
			// What reconcile keeps is live, an unanswering supervisor too.
			live[id], liveRT[r.Runtime()] = true, true
			if l == livenessUnknown {
				in.add(FindingSilentShim, "problem", "sandbox "+id, "the shim runs but does not answer (stopped or overloaded); reconcile keeps the sandbox")
			}
		case r.State == nodestore.StateRunning:
			in.add(FindingDeadShim, "problem", "sandbox "+id, "record says running but the shim is gone; reconcile removes the sandbox")
		default:
			in.add(FindingHalfMade, "problem", "sandbox "+id, fmt.Sprintf("record is %s: a create or kill was cut short; reconcile removes the sandbox", r.State))
		}
	}
	stateIDs := stateDirIDs(cfg)
	for _, name := range stateIDs {
		if liveRT[name] || in.Source != SourceStateDirs {
			continue
		}
		if l, _ := probe(ctx, filepath.Join(cfg.sandboxesDir(), name), false); l != livenessDead {
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

// inspectDataplane classifies mappings and endpoints, both owned by
// runtime names (liveRT: a sandbox made from a pool slot keeps the slot's
// name).
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
	// Mappings are owned by runtime names (a slot's id for a sandbox made
	// from it).
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
