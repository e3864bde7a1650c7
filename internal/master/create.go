package master

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// Limits on create requests.
const (
	DefaultTimeout  = 300 * time.Second
	MaxTimeout      = 24 * time.Hour
	MaxMapEntries   = 128
	MaxKeyBytes     = 256
	MaxValueBytes   = 16 << 10
	MaxTemplateName = 256
)

// CreateParams is a validated-on-use create request.
type CreateParams struct {
	TemplateID string
	// Alias, when set, is the name the client asked for and the caller
	// resolved to TemplateID (a template tag); recorded as the alias.
	Alias string
	// Timeout until endAt; nil = Config.DefaultTimeout.
	Timeout  *time.Duration
	Metadata map[string]string
	EnvVars  map[string]string
	// AutoPause pauses instead of killing at endAt.
	AutoPause       bool
	AutoPauseMemory bool
	AutoResume      bool
	// AllowInternetAccess nil = allowed.
	AllowInternetAccess *bool
	Network             *Network
	// BuildSandbox makes a template build sandbox: its writable layer
	// stays on the node's filesystem (no disk size limit) so that the node
	// can commit it as a template (nodeproto.CreateRequest.WritableOnHost).
	BuildSandbox bool
}

// Create validates p, starts a sandbox on the node and records it. Nothing
// is recorded when the node fails; a node without capacity yields
// errdefs.ErrUnavailable.
func (m *Master) Create(ctx context.Context, p CreateParams) (store.Sandbox, error) {
	timeout, err := m.resolveTimeout(p.Timeout)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	if err := validateCreate(p); err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	updater, _ := m.node.(NetworkUpdater)
	if p.Network.hasEgressRules() && updater == nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w: this node cannot enforce network allowOut/denyOut/egressProxy/rules; use allow_internet_access only",
			errdefs.ErrNotImplemented)
	}
	tpl, err := m.node.Template(ctx, p.TemplateID)
	if errors.Is(err, errdefs.ErrNotFound) {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w: template %q not found; list templates with `cube template ls`",
			errdefs.ErrInvalidArgument, p.TemplateID)
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: template %q: %w", p.TemplateID, err)
	}
	id, err := newSandboxID()
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	token, err := newAccessToken()
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	allowInternet := p.AllowInternetAccess == nil || *p.AllowInternetAccess
	live, err := m.node.CreateSandbox(ctx, nodeproto.CreateRequest{
		SandboxID: id, Template: tpl.Name, EnvVars: p.EnvVars, EnvdAccessToken: token, AllowInternet: allowInternet,
		NodeMayChooseToken: true, WritableOnHost: p.BuildSandbox,
	})
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("create sandbox: %w", nodeCreateError(err))
	}
	if live.EnvdAccessToken != "" {
		token = live.EnvdAccessToken // the node kept a pre-started slot's token
	}
	sb, err := m.recordCreated(ctx, p, tpl, live, id, token, timeout, updater, allowInternet)
	if err != nil {
		cleanup := context.WithoutCancel(ctx)
		if kerr := m.node.KillSandbox(cleanup, id); kerr != nil && !errors.Is(kerr, errdefs.ErrNotFound) {
			m.log.Error("kill sandbox after failed create", "sandbox", id, "err", kerr)
		}
		return store.Sandbox{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	m.log.Info("sandbox created", "sandbox", id, "template", tpl.Name, "end_at", sb.EndAt)
	m.rearm()
	return sb, nil
}

// recordCreated applies the network policy (if any) and persists the record.
func (m *Master) recordCreated(ctx context.Context, p CreateParams, tpl TemplateInfo, live nodeproto.Sandbox,
	id, token string, timeout time.Duration, updater NetworkUpdater, allowInternet bool) (store.Sandbox, error) {
	if p.Network.hasEgressRules() {
		if err := updater.UpdateNetwork(ctx, id, NetworkPolicy{AllowInternet: allowInternet, Network: *p.Network}); err != nil {
			return store.Sandbox{}, fmt.Errorf("apply network policy: %w", err)
		}
	}
	var network json.RawMessage
	if p.Network != nil {
		b, err := json.Marshal(p.Network)
		if err != nil {
			return store.Sandbox{}, fmt.Errorf("encode network: %w", err)
		}
		network = b
	}
	onTimeout := "kill"
	if p.AutoPause {
		onTimeout = "pause"
	}
	now := time.Now()
	started := live.StartedAt
	if started.IsZero() {
		started = now
	}
	sb := store.Sandbox{
		ID: id, TemplateID: tpl.Name, NodeID: live.NodeID, // the node the registry scheduled it on
		Metadata: p.Metadata, EnvVars: p.EnvVars,
		StartedAt: started.UTC(), EndAt: now.Add(timeout).UTC(), State: store.StateRunning,
		CPUCount: orDefault(live.CPUCount, tpl.CPUCount), MemoryMB: orDefault(live.MemoryMB, tpl.MemoryMB),
		DiskSizeMB: orDefault(live.DiskSizeMB, tpl.DiskSizeMB), EnvdVersion: live.EnvdVersion, EnvdAccessToken: token,
		TrafficAccessToken:  trafficToken(p.Network),
		AllowInternetAccess: p.AllowInternetAccess, Network: network,
		Lifecycle: store.Lifecycle{OnTimeout: onTimeout, AutoResume: p.AutoResume, KeepMemory: p.AutoPauseMemory},
	}
	if p.TemplateID != tpl.Name {
		sb.Alias = p.TemplateID
	}
	if p.Alias != "" {
		sb.Alias = p.Alias
	}
	if err := m.store.CreateSandbox(ctx, sb); err != nil {
		return store.Sandbox{}, err
	}
	return sb, nil
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// nodeCreateError maps node failures to the kinds the API reports: capacity
// problems are "service busy" (503), not rate limiting.
func nodeCreateError(err error) error {
	switch {
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return fmt.Errorf("%w: node has no capacity, retry later: %w", errdefs.ErrUnavailable, err)
	case errors.Is(err, errdefs.ErrNotFound):
		return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	return err
}

// resolveTimeout applies the default and the bounds 0 < t <= MaxTimeout.
func (m *Master) resolveTimeout(t *time.Duration) (time.Duration, error) {
	if t == nil {
		return m.cfg.DefaultTimeout, nil
	}
	if *t <= 0 || *t > MaxTimeout {
		return 0, fmt.Errorf("%w: timeout must be between 1 and %d seconds, got %d",
			errdefs.ErrInvalidArgument, int(MaxTimeout/time.Second), int64(t.Seconds()))
	}
	return *t, nil
}

func validateCreate(p CreateParams) error {
	if strings.TrimSpace(p.TemplateID) == "" {
		return fmt.Errorf("%w: templateID is required", errdefs.ErrInvalidArgument)
	}
	if len(p.TemplateID) > MaxTemplateName || !utf8.ValidString(p.TemplateID) {
		return fmt.Errorf("%w: templateID is too long or not valid UTF-8", errdefs.ErrInvalidArgument)
	}
	if err := validateMap("metadata", p.Metadata, false); err != nil {
		return err
	}
	if err := validateMap("envVars", p.EnvVars, true); err != nil {
		return err
	}
	return p.Network.validate()
}

func validateMap(what string, m map[string]string, env bool) error {
	if len(m) > MaxMapEntries {
		return fmt.Errorf("%w: %s has %d entries, at most %d are allowed", errdefs.ErrInvalidArgument, what, len(m), MaxMapEntries)
	}
	for k, v := range m {
		switch {
		case k == "":
			return fmt.Errorf("%w: %s has an empty key", errdefs.ErrInvalidArgument, what)
		case len(k) > MaxKeyBytes:
			return fmt.Errorf("%w: %s key %.32q... is longer than %d bytes", errdefs.ErrInvalidArgument, what, k, MaxKeyBytes)
		case len(v) > MaxValueBytes:
			return fmt.Errorf("%w: %s value of %q is longer than %d bytes", errdefs.ErrInvalidArgument, what, k, MaxValueBytes)
		case strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0):
			return fmt.Errorf("%w: %s entry %q contains a NUL byte", errdefs.ErrInvalidArgument, what, k)
		case env && strings.ContainsRune(k, '='):
			return fmt.Errorf("%w: envVars key %q contains '='", errdefs.ErrInvalidArgument, k)
		}
	}
	return nil
}

// trafficToken is a fresh traffic access token when the create disabled
// public traffic, else "".
func trafficToken(n *Network) string {
	if !wantsTrafficToken(n) {
		return ""
	}
	t, err := newAccessToken()
	if err != nil {
		return ""
	}
	return t
}
