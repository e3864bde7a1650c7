// Package cluster is the server's view of its nodes: registration with the
// version-skew policy, heartbeats and probes (health), scheduling with
// capacity accounting, isolate/uncordon/drain, and routing of sandbox
// operations to the node that runs the sandbox.
package cluster

import (
	"context"
	"encoding/json"
	"time"
)

// State is a node's health and operator state.
type State string

// Node states. Ready nodes take new sandboxes; Isolated and Draining nodes
// keep their sandboxes but take no new ones; Down nodes missed heartbeats
// and failed probes. Pending nodes are known from the store but have not
// shown, since this server started, that they answer with the token on
// record (no heartbeat, registration or probe yet): a restarted node that
// has not registered again is not Ready on the strength of its old record.
const (
	StateReady    State = "Ready"
	StatePending  State = "Pending"
	StateIsolated State = "Isolated"
	StateDraining State = "Draining"
	StateDown     State = "Down"
)

// Capacity is what a node offers to the scheduler.
type Capacity struct {
	CPUCount     int   `json:"cpuCount"`
	MemoryMB     int64 `json:"memoryMB"`
	MaxSandboxes int   `json:"maxSandboxes"`
	MaxCreates   int   `json:"maxCreates"`
	// MemoryReserveMB is the memory the node keeps free, checked against
	// its usage reports (NodeUsage); 0 (cubelets older than this field):
	// no such check.
	MemoryReserveMB int64 `json:"memoryReserveMB,omitempty"`
}

// TemplateRef names a template a node holds.
type TemplateRef struct {
	Name       string `json:"name"`
	Digest     string `json:"digest"`
	CPUCount   int    `json:"cpuCount"`
	MemoryMB   int    `json:"memoryMB"`
	DiskSizeMB int    `json:"diskSizeMB"`
	// Layers are the digests of the template's layer stack, bottom first
	// (docs/templates.md); empty from nodes of an older version, and for a
	// flat template the server holds.
	Layers []string `json:"layers,omitempty"`
	// Base names the flat template whose digest is Layers[0], for a
	// template the server ships as layers (a store record).
	Base string `json:"base,omitempty"`
	// Defaults are the template's sandbox defaults as its template.json
	// records them (nodes report them; empty for none or older nodes).
	Defaults json.RawMessage `json:"defaults,omitempty"`
}

// chain is t's layer stack: its Layers, else its digest alone.
func (t TemplateRef) chain() []string {
	if len(t.Layers) > 0 {
		return t.Layers
	}
	if t.Digest == "" {
		return nil
	}
	return []string{t.Digest}
}

// DrainPolicy says what happens to a draining node's sandboxes after the
// grace period: wait for their TTLs (up to the deadline) or kill them.
type DrainPolicy string

// Drain policies.
const (
	DrainWait DrainPolicy = "wait"
	DrainKill DrainPolicy = "kill"
)

// Drain is a drain in progress; persisted so it resumes after a restart.
type Drain struct {
	Policy    DrainPolicy   `json:"policy"`
	Grace     time.Duration `json:"grace"`
	Deadline  time.Duration `json:"deadline"` // for DrainWait: then kill what is left
	StartedAt time.Time     `json:"startedAt"`
}

// NodeRecord is the durable part of a node's registration.
type NodeRecord struct {
	ID           string        `json:"id"`
	Version      string        `json:"version"`
	RPCURL       string        `json:"rpcURL"`
	DataIP       string        `json:"dataIP"`
	Token        string        `json:"token"`
	Capacity     Capacity      `json:"capacity"`
	Templates    []TemplateRef `json:"templates"`
	Isolated     bool          `json:"isolated"`
	Drain        *Drain        `json:"drain,omitempty"`
	RegisteredAt time.Time     `json:"registeredAt"`
	// Health, shared by server replicas through the store: any replica may
	// receive a node's heartbeat; the leader decides Down.
	LastHeartbeat time.Time `json:"lastHeartbeat"`
	Down          bool      `json:"down,omitempty"`
	DownReason    string    `json:"downReason,omitempty"`
	// Health is the node's last reported self-check (socket, preflight),
	// kept in the record so every replica serves it; nil from cubelets
	// that do not report it.
	Health *NodeHealth `json:"health,omitempty"`
	// Progress is the drain progress the leader last stored; kept apart
	// from the document (NodeStore.SetDrainProgress), nil when none.
	Progress *DrainProgress `json:"-"`
}

// DrainProgress is where the replica driving a drain has got to, stored so
// that every replica reports the same phase. It belongs to the drain that
// started at DrainStartedAt; a newer drain ignores it.
type DrainProgress struct {
	DrainStartedAt time.Time `json:"drainStartedAt"`
	Phase          string    `json:"phase"` // grace, waiting, killing, done
	Remaining      int       `json:"remaining"`
	UpdatedAt      time.Time `json:"updatedAt"`
}

// NodeStore persists node records (the server's SQL store implements it).
type NodeStore interface {
	PutNode(ctx context.Context, n NodeRecord) error
	SetDrainProgress(ctx context.Context, id string, p DrainProgress) error
	DeleteNode(ctx context.Context, id string) error
	ListNodes(ctx context.Context) ([]NodeRecord, error)
}

// NodeStatus is a node as `cube node ls` shows it.
type NodeStatus struct {
	ID            string      `json:"id"`
	State         State       `json:"state"`
	Reason        string      `json:"reason,omitempty"`
	Version       string      `json:"version"`
	Address       string      `json:"address"`
	Sandboxes     int         `json:"sandboxes"`
	Inflight      int         `json:"inflightCreates"`
	UsedCPU       int         `json:"usedCPU"`
	UsedMemoryMB  int64       `json:"usedMemoryMB"`
	Capacity      Capacity    `json:"capacity"`
	Templates     []string    `json:"templates"`
	LastHeartbeat time.Time   `json:"lastHeartbeat"`
	Drain         *DrainState `json:"drain,omitempty"`
	Health        *NodeHealth `json:"health,omitempty"`
	Usage         *NodeUsage  `json:"usage,omitempty"` // last report this replica received
}

// DrainState reports a drain's progress.
type DrainState struct {
	Policy    DrainPolicy `json:"policy"`
	Phase     string      `json:"phase"` // grace, waiting, killing, done
	StartedAt time.Time   `json:"startedAt"`
	Remaining int         `json:"remaining"`
}
