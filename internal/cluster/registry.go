package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/version"
)

// Config configures a Registry.
type Config struct {
	// ServerVersion is compared with each cubelet's (version.CheckSkew).
	ServerVersion string
	// HeartbeatInterval is what nodes are told to use (default 2 s).
	HeartbeatInterval time.Duration
	// DownAfter is how long without a heartbeat before the node is probed;
	// a failed probe then marks it Down (default 10 s).
	DownAfter time.Duration
	// ProbeTimeout bounds one probe (default 2 s).
	ProbeTimeout time.Duration
	// Recent protects a sandbox from heartbeat reconciliation for this long
	// after its create started (default 2 min), so a create racing with a
	// heartbeat is never mistaken for a leftover.
	Recent time.Duration
	// Templates are the templates the server can ship to nodes that lack
	// them (template distribution); nil when the server holds none.
	Templates TemplateSource
	// Layers, when set, receives the top layer of every template committed
	// on a node and its record, so that any node can make it (see
	// shipCommitted); nil keeps committed templates on their node.
	Layers LayerStore
	// KeepOnNode names templates that stay on the node that committed
	// them even when Layers is set (the template build step cache).
	KeepOnNode func(name string) bool
	HTTPClient *http.Client
	// Connect returns the client that reaches a node; nil means the
	// node's CubeletService over HTTP at its RPCURL with its token. An
	// all-in-one Cube connects its own node in-process.
	Connect func(NodeRecord) *nodeapi.Client
	// Clock tells the time of heartbeats, Down decisions, drains and
	// create reservations (default the real one; tests step a fake).
	Clock  clock.PassiveClock
	Logger *slog.Logger
}

// TemplateSource is the server's own template registry.
type TemplateSource interface {
	// ServerTemplate returns errdefs.ErrNotFound when the server lacks it.
	ServerTemplate(ctx context.Context, name string) (TemplateRef, error)
}

func (c *Config) defaults() {
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 2 * time.Second
	}
	if c.DownAfter <= 0 {
		c.DownAfter = 10 * time.Second
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 2 * time.Second
	}
	if c.Recent <= 0 {
		c.Recent = 2 * time.Minute
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// SandboxIndex is the server store's view of sandboxes and their nodes.
type SandboxIndex interface {
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	AllSandboxes(ctx context.Context) ([]store.Sandbox, error)
}

// Lifecycle lets the registry end sandboxes through the master, so the
// store and the proxy stay consistent.
type Lifecycle interface {
	Kill(ctx context.Context, id string) error
	Forget(ctx context.Context, id string) error
}

// node is the registry's live state for one node.
type node struct {
	rec       NodeRecord
	client    *nodeapi.Client
	lastBeat  time.Time
	down      bool
	reason    string
	usedCPU   int
	usedMemMB int64
	count     int
	inflight  int
	usage     *NodeUsage // last usage report received here (usage.go)
	// confirmed: the node has answered since this server started (a
	// heartbeat or registration here or, read from the store, through
	// another replica; or a probe with its token on record).
	confirmed bool
}

func (n *node) state() State {
	switch {
	case n.down:
		return StateDown
	case n.rec.Drain != nil:
		return StateDraining
	case n.rec.Isolated:
		return StateIsolated
	case !n.confirmed:
		return StatePending
	default:
		return StateReady
	}
}

// pendingReason says why a node is Pending.
const pendingReason = "no heartbeat since this server started, and its stored token got no answer: waiting for the node to register or heartbeat"

// Registry is the server's node registry.
type Registry struct {
	cfg   Config
	store NodeStore
	index SandboxIndex
	log   *slog.Logger

	mu sync.Mutex
	// persistMu serialises this replica's read-modify-writes of node
	// records (see persist).
	persistMu sync.Mutex
	nodes     map[string]*node
	recent    map[string]time.Time // sandbox id -> create start
	holds     map[string]hold      // sandbox id -> capacity held until the master records it
	// unknown holds, per node, when this replica first saw each running
	// sandbox it has no record of (see strayGrace).
	unknown map[string]map[string]time.Time
	life    Lifecycle
	started time.Time // a node heartbeating after it is confirmed (see node.confirmed)
}

// NewRegistry returns a registry backed by st; call Load before serving.
func NewRegistry(cfg Config, st NodeStore, index SandboxIndex) *Registry {
	cfg.defaults()
	return &Registry{cfg: cfg, store: st, index: index, log: cfg.Logger.With("component", "cluster"),
		nodes: map[string]*node{}, recent: map[string]time.Time{}, holds: map[string]hold{},
		unknown: map[string]map[string]time.Time{}, started: cfg.Clock.Now()}
}

// SetLifecycle wires the master in (it is built after the registry).
func (r *Registry) SetLifecycle(l Lifecycle) {
	r.mu.Lock()
	r.life = l
	r.mu.Unlock()
}

// Load reads registered nodes and recomputes capacity accounting from the
// sandbox records. Nodes count as alive from now until they miss heartbeats.
func (r *Registry) Load(ctx context.Context) error {
	recs, err := r.store.ListNodes(ctx)
	if err != nil {
		return fmt.Errorf("load nodes: %w", err)
	}
	r.mu.Lock()
	now := r.cfg.Clock.Now()
	for _, rec := range recs {
		// A freshly started server gives every node a full DownAfter
		// before judging it, whatever the stored heartbeat says.
		r.nodes[rec.ID] = &node{rec: rec, client: r.newClient(rec), lastBeat: now, down: rec.Down, reason: rec.DownReason}
	}
	r.mu.Unlock()
	r.confirmByProbe(ctx)
	return r.recount(ctx)
}

// confirmByProbe probes every loaded node that is not Down with its token
// on record, at once and in parallel (each bounded by ProbeTimeout), so
// nodes that answer are Ready as soon as the server serves; the others stay
// Pending until they heartbeat or register.
func (r *Registry) confirmByProbe(ctx context.Context) {
	r.mu.Lock()
	var todo []*node
	for _, n := range r.nodes {
		if !n.down && !n.confirmed {
			todo = append(todo, n)
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.mu.Lock()
			cl := n.client
			r.mu.Unlock()
			err := r.probe(ctx, cl)
			r.mu.Lock()
			defer r.mu.Unlock()
			if err == nil {
				n.confirmed = true
				return
			}
			if n.reason == "" {
				n.reason = pendingReason
			}
			r.log.Info("node pending: no answer with its stored token", "node", n.rec.ID, "err", err)
		}()
	}
	wg.Wait()
}

// Sync merges node records written by other server replicas (new nodes,
// heartbeats they received, Down decisions of the leader, operator
// actions, drain progress) into this replica's view and recounts capacity
// from the sandbox records.
func (r *Registry) Sync(ctx context.Context) error {
	if err := r.Refresh(ctx); err != nil {
		return err
	}
	return r.recount(ctx)
}

// Refresh merges the stored node records into this replica's view, with
// one query on the nodes table and no recount: cheap enough to run before
// every scheduling decision and every node listing, so that operator state
// written through another replica (isolate, uncordon, drain), a new token
// of a re-registered node and drain progress take effect at once instead
// of at the next Sync.
func (r *Registry) Refresh(ctx context.Context) error {
	recs, err := r.store.ListNodes(ctx)
	if err != nil {
		return fmt.Errorf("read node records: %w", err)
	}
	r.merge(recs)
	return nil
}

// merge replaces this replica's records with recs (the whole table).
func (r *Registry) merge(recs []NodeRecord) {
	seen := map[string]bool{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range recs {
		seen[rec.ID] = true
		n, ok := r.nodes[rec.ID]
		if !ok {
			r.nodes[rec.ID] = &node{rec: rec, client: r.newClient(rec), lastBeat: rec.LastHeartbeat, down: rec.Down, reason: rec.DownReason,
				confirmed: rec.LastHeartbeat.After(r.started)}
			continue
		}
		if rec.LastHeartbeat.After(r.started) {
			n.confirmed = true // it heartbeats through another replica
		}
		if rec.Token != n.rec.Token || rec.RPCURL != n.rec.RPCURL {
			n.client = r.newClient(rec)
		}
		if rec.LastHeartbeat.After(n.lastBeat) {
			n.lastBeat = rec.LastHeartbeat
		}
		n.rec = rec
		n.down, n.reason = rec.Down, rec.DownReason
	}
	for id := range r.nodes {
		if !seen[id] {
			delete(r.nodes, id)
		}
	}
}

// SyncLoop runs Sync every heartbeat interval until ctx ends. Every server
// replica runs it (not only the leader).
func (r *Registry) SyncLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := r.Sync(ctx); err != nil {
				r.log.Warn("sync nodes from store", "err", err)
			}
		}
	}
}

func (r *Registry) newClient(rec NodeRecord) *nodeapi.Client {
	if r.cfg.Connect != nil {
		return r.cfg.Connect(rec)
	}
	return nodeapi.NewClient(r.cfg.HTTPClient, rec.RPCURL, rec.Token)
}

// recount recomputes every node's used capacity from the sandbox records.
func (r *Registry) recount(ctx context.Context) error {
	all, err := r.index.AllSandboxes(ctx)
	if err != nil {
		return err
	}
	r.recountFrom(all)
	return nil
}

// recountFrom recomputes every node's used capacity from all, the whole
// sandbox table as just read.
func (r *Registry) recountFrom(all []store.Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.nodes {
		n.usedCPU, n.usedMemMB, n.count = 0, 0, 0
	}
	stored := make(map[string]bool, len(all))
	for _, sb := range all {
		stored[sb.ID] = true
		if n, ok := r.nodes[sb.NodeID]; ok {
			n.usedCPU += sb.CPUCount
			n.usedMemMB += int64(sb.MemoryMB)
			n.count++
		}
	}
	// Reservations of creates not yet recorded by the master still count,
	// or a recount racing with a create would free capacity it holds.
	for id, h := range r.holds {
		if stored[id] || r.cfg.Clock.Since(h.at) > r.cfg.Recent {
			delete(r.holds, id)
			continue
		}
		if n, ok := r.nodes[h.node]; ok {
			n.usedCPU += h.cpu
			n.usedMemMB += h.memMB
			if h.created {
				n.count++
			}
		}
	}
}

// hold is capacity reserved for a create the master has not recorded yet.
type hold struct {
	node    string
	cpu     int
	memMB   int64
	created bool // the node created it; the master is recording it
	at      time.Time
}

// Register admits a node (or refreshes its registration) after checking the
// version-skew policy. Operator state (isolated, drain) survives
// re-registration.
func (r *Registry) Register(ctx context.Context, rec NodeRecord) error {
	if rec.ID == "" || rec.RPCURL == "" || rec.DataIP == "" || rec.Token == "" {
		return fmt.Errorf("registration needs node id, rpc url, data ip and token: %w", errdefs.ErrInvalidArgument)
	}
	if err := version.CheckSkew(r.cfg.ServerVersion, rec.Version); err != nil {
		return err
	}
	reg := rec
	rec, err := r.persist(ctx, reg.ID, func(stored *NodeRecord, found bool) error {
		// Registration fields come from the cubelet; operator state
		// (isolated, drain) and the first registration time are kept.
		isolated, drain, first := stored.Isolated, stored.Drain, stored.RegisteredAt
		*stored = reg
		if found {
			stored.Isolated, stored.Drain, stored.RegisteredAt = isolated, drain, first
		}
		if stored.RegisteredAt.IsZero() {
			stored.RegisteredAt = r.cfg.Clock.Now().UTC()
		}
		stored.LastHeartbeat, stored.Down, stored.DownReason = r.cfg.Clock.Now().UTC(), false, ""
		return nil
	})
	if err != nil {
		return fmt.Errorf("persist node %s: %w", reg.ID, err)
	}
	r.mu.Lock()
	n, ok := r.nodes[rec.ID]
	if !ok {
		n = &node{}
		r.nodes[rec.ID] = n
	}
	n.rec, n.client, n.lastBeat, n.down, n.reason, n.confirmed = rec, r.newClient(rec), r.cfg.Clock.Now(), false, "", true
	r.mu.Unlock()
	r.log.Info("node registered", "node", rec.ID, "version", rec.Version, "rpc", rec.RPCURL, "dataIP", rec.DataIP)
	return r.recount(ctx)
}

// Nodes returns every node's status, sorted by id.
func (r *Registry) Nodes() []NodeStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]NodeStatus, 0, len(r.nodes))
	for _, n := range r.nodes {
		out = append(out, r.statusLocked(n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Node returns one node's status.
func (r *Registry) Node(id string) (NodeStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return NodeStatus{}, fmt.Errorf("node %s: %w", id, errdefs.ErrNotFound)
	}
	return r.statusLocked(n), nil
}

func (r *Registry) statusLocked(n *node) NodeStatus {
	st := NodeStatus{
		ID: n.rec.ID, State: n.state(), Reason: n.reason, Version: n.rec.Version, Address: n.rec.RPCURL,
		Sandboxes: n.count, Inflight: n.inflight, UsedCPU: n.usedCPU, UsedMemoryMB: n.usedMemMB,
		Capacity: n.rec.Capacity, LastHeartbeat: n.lastBeat.UTC(), Health: n.rec.Health, Usage: n.usage,
	}
	for _, t := range n.rec.Templates {
		st.Templates = append(st.Templates, t.Name)
	}
	if d := n.rec.Drain; d != nil {
		st.Drain = &DrainState{Policy: d.Policy, StartedAt: d.StartedAt}
		if p := n.rec.Progress; p != nil && p.DrainStartedAt.Equal(d.StartedAt) {
			// What the replica driving the drain stored: the same on
			// every replica.
			st.Drain.Phase, st.Drain.Remaining = p.Phase, p.Remaining
		} else {
			// Nothing stored for this drain yet: the phase the clock
			// gives and this replica's count.
			st.Drain.Phase, st.Drain.Remaining = r.drainPhase(*d), n.count
		}
	}
	return st
}

// persist applies mutate to a node's stored record, read fresh from the
// store so that fields written by other paths and other replicas are kept,
// writes it back and mirrors it into memory. found says whether the store
// had the record. Writers on this replica are serialised; across replicas
// the read-to-write window is a few milliseconds.
func (r *Registry) persist(ctx context.Context, id string, mutate func(rec *NodeRecord, found bool) error) (NodeRecord, error) {
	r.persistMu.Lock()
	defer r.persistMu.Unlock()
	recs, err := r.store.ListNodes(ctx)
	if err != nil {
		return NodeRecord{}, err
	}
	rec, found := NodeRecord{ID: id}, false
	for _, x := range recs {
		if x.ID == id {
			rec, found = x, true
		}
	}
	if err := mutate(&rec, found); err != nil {
		return NodeRecord{}, err
	}
	if err := r.store.PutNode(ctx, rec); err != nil {
		return NodeRecord{}, err
	}
	r.mu.Lock()
	if n, ok := r.nodes[id]; ok {
		n.rec = rec
	}
	r.mu.Unlock()
	return rec, nil
}
