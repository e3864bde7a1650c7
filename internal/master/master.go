// Package master is cubemaster: the sandbox lifecycle on the control plane.
// It validates requests, asks a node to create/kill/pause sandboxes, keeps
// the records in the store and runs the expiry loop (end of a sandbox's timeout).
package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/leader"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// TemplateInfo describes a template a node can start.
type TemplateInfo struct {
	Name       string
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
}

// Node is what the master needs from the node that runs sandboxes.
type Node interface {
	// CreateSandbox returns once envd inside the sandbox answers.
	CreateSandbox(ctx context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error)
	// KillSandbox returns errdefs.ErrNotFound for an unknown sandbox.
	KillSandbox(ctx context.Context, id string) error
	// SandboxAddr returns the "ip:port" the proxy dials for a guest port.
	SandboxAddr(ctx context.Context, id string, port uint16) (string, error)
	SandboxMetrics(ctx context.Context, id string) (nodeproto.Metrics, error)
	// PauseSandbox freezes the sandbox (cgroup freezer); ResumeSandbox thaws it.
	PauseSandbox(ctx context.Context, id string) error
	ResumeSandbox(ctx context.Context, id string) error
	// Template returns errdefs.ErrNotFound for an unknown template.
	Template(ctx context.Context, name string) (TemplateInfo, error)
}

// NetworkUpdater is implemented by nodes that can change a sandbox's egress
// policy. Without it, network rules beyond allow_internet_access at create
// time are refused with errdefs.ErrNotImplemented.
type NetworkUpdater interface {
	UpdateNetwork(ctx context.Context, id string, p NetworkPolicy) error
}

// Store is what the master needs from the control-plane store.
type Store interface {
	CreateSandbox(ctx context.Context, sb store.Sandbox) error
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	SetEndAt(ctx context.Context, id string, endAt time.Time) error
	SetState(ctx context.Context, id string, state store.State, endAt time.Time) error
	SetNetwork(ctx context.Context, id string, network json.RawMessage, allowInternet *bool) error
	ListSandboxes(ctx context.Context, f store.ListFilter) (store.Page, error)
	ExpiredSandboxes(ctx context.Context, now time.Time) ([]store.Sandbox, error)
	NextEndAt(ctx context.Context, after time.Time) (time.Time, bool, error)
	AllSandboxes(ctx context.Context) ([]store.Sandbox, error)
}

var _ Store = (*store.SQLite)(nil)

// Config configures a Master.
type Config struct {
	// Domain is returned to clients as the sandbox domain (null when empty).
	Domain string
	// DefaultTimeout applies when a create/connect request has no timeout
	// (default 300 s).
	DefaultTimeout time.Duration
	Logger         *slog.Logger
	// Elector decides whether this replica runs the expiry loop. Several
	// replicas sharing one PostgreSQL store set a leader.Postgres elector so
	// only the leader expires sandboxes; nil means always (one replica, SQLite). With an
	// elector the expiry loop also re-reads the store at least every
	// sharedExpiryPoll, since other replicas change end times it is not told of.
	Elector leader.Elector
}

// Master runs the sandbox lifecycle.
type Master struct {
	store  Store
	node   Node
	cfg    Config
	log    *slog.Logger
	locks  idLocks
	kick   chan struct{}
	stop   context.CancelFunc
	done   chan struct{}
	once   sync.Once
	goneMu sync.Mutex
	gone   []func(id string)
}

// New returns a Master and starts its expiry loop; stop it with Shutdown.
// Call Restore once at start-up so sandboxes from a previous run expire.
func New(s Store, node Node, cfg Config) *Master {
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Master{
		store: s, node: node, cfg: cfg, log: cfg.Logger.With("component", "cubemaster"),
		kick: make(chan struct{}, 1), stop: cancel, done: make(chan struct{}),
	}
	go m.runExpiry(ctx)
	return m
}

// Domain is the configured sandbox domain ("" when none).
func (m *Master) Domain() string { return m.cfg.Domain }

// OnGone registers fn to be called with the id of a sandbox that stopped
// serving traffic (killed, expired or paused). The proxy uses it to drop
// cached addresses. fn must not block.
func (m *Master) OnGone(fn func(id string)) {
	m.goneMu.Lock()
	defer m.goneMu.Unlock()
	m.gone = append(m.gone, fn)
}

func (m *Master) notifyGone(id string) {
	m.goneMu.Lock()
	fns := append([]func(string){}, m.gone...)
	m.goneMu.Unlock()
	for _, fn := range fns {
		fn(id)
	}
}

// Restore arms the expiry loop from the store at start-up and reports how many
// sandboxes are known. Expired ones are handled right away by the expiry loop.
func (m *Master) Restore(ctx context.Context) error {
	all, err := m.store.AllSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("restore sandboxes: %w", err)
	}
	running := 0
	for _, sb := range all {
		if sb.State == store.StateRunning {
			running++
		}
	}
	m.log.Info("sandboxes restored", "total", len(all), "running", running)
	m.rearm()
	return nil
}

// Shutdown stops the expiry loop (waiting at most until ctx is done) and, when
// killSandboxes is set, kills every known sandbox, running or paused. Errors
// of individual kills are joined.
func (m *Master) Shutdown(ctx context.Context, killSandboxes bool) error {
	m.once.Do(m.stop)
	select {
	case <-m.done:
	case <-ctx.Done():
		return fmt.Errorf("shutdown: waiting for the expiry loop: %w", ctx.Err())
	}
	if !killSandboxes {
		return nil
	}
	all, err := m.store.AllSandboxes(ctx)
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	var errs []error
	for _, sb := range all {
		if err := m.Kill(ctx, sb.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rearm wakes the expiry loop so it recomputes its timer from the store.
func (m *Master) rearm() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// idLocks serialises lifecycle operations per sandbox id.
type idLocks struct {
	mu sync.Mutex
	m  map[string]*idLock
}

type idLock struct {
	mu   sync.Mutex
	refs int
}

func (l *idLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*idLock{}
	}
	e := l.m[id]
	if e == nil {
		e = &idLock{}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
}
