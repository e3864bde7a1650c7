package master

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// MaxRefresh bounds POST /sandboxes/{id}/refreshes durations.
const MaxRefresh = time.Hour

// Get returns a sandbox's record; errdefs.ErrNotFound if unknown.
func (m *Master) Get(ctx context.Context, id string) (store.Sandbox, error) {
	return m.store.GetSandbox(ctx, id)
}

// List returns one page of sandboxes.
func (m *Master) List(ctx context.Context, f store.ListFilter) (store.Page, error) {
	return m.store.ListSandboxes(ctx, f)
}

// Kill stops a sandbox and forgets it; errdefs.ErrNotFound if unknown. A
// sandbox the node no longer knows is forgotten too.
func (m *Master) Kill(ctx context.Context, id string) error {
	if nodeproto.KillReason(ctx) == "" {
		ctx = nodeproto.WithKillReason(ctx, nodeproto.KillReasonRequest)
	}
	unlock := m.locks.lock(id)
	defer unlock()
	return m.killLocked(ctx, id)
}

func (m *Master) killLocked(ctx context.Context, id string) error {
	if _, err := m.store.GetSandbox(ctx, id); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	if err := m.node.KillSandbox(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	m.notifyGone(id)
	if err := m.store.DeleteSandbox(context.WithoutCancel(ctx), id); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	m.log.Info("sandbox killed", "sandbox", id)
	return nil
}

// SetTimeout sets endAt = now + timeout; it may shorten as well as extend.
func (m *Master) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	if _, err := m.resolveTimeout(&timeout); err != nil {
		return fmt.Errorf("set timeout of sandbox %s: %w", id, err)
	}
	unlock := m.locks.lock(id)
	defer unlock()
	if _, err := m.store.GetSandbox(ctx, id); err != nil {
		return fmt.Errorf("set timeout: %w", err)
	}
	if err := m.store.SetEndAt(ctx, id, time.Now().Add(timeout).UTC()); err != nil {
		return fmt.Errorf("set timeout: %w", err)
	}
	m.rearm()
	return nil
}

// Refresh extends a running sandbox's endAt to at least now + d (nil =
// default timeout, at most MaxRefresh); it never shortens.
func (m *Master) Refresh(ctx context.Context, id string, d *time.Duration) error {
	dur := m.cfg.DefaultTimeout
	if d != nil {
		if *d < 0 || *d > MaxRefresh {
			return fmt.Errorf("refresh sandbox %s: %w: duration must be between 0 and %d seconds",
				id, errdefs.ErrInvalidArgument, int(MaxRefresh/time.Second))
		}
		dur = *d
	}
	unlock := m.locks.lock(id)
	defer unlock()
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("refresh: %w", err)
	}
	if end := time.Now().Add(dur); end.After(sb.EndAt) {
		if err := m.store.SetEndAt(ctx, id, end.UTC()); err != nil {
			return fmt.Errorf("refresh: %w", err)
		}
		m.rearm()
	}
	return nil
}

// Connect makes a sandbox usable for at least timeout (nil = default): a
// running sandbox gets endAt = max(endAt, now+timeout); a paused one is
// resumed with endAt = now+timeout and resumed is true.
func (m *Master) Connect(ctx context.Context, id string, timeout *time.Duration) (sb store.Sandbox, resumed bool, err error) {
	t, err := m.resolveTimeout(timeout)
	if err != nil {
		return store.Sandbox{}, false, fmt.Errorf("connect to sandbox %s: %w", id, err)
	}
	unlock := m.locks.lock(id)
	defer unlock()
	sb, err = m.store.GetSandbox(ctx, id)
	if err != nil {
		return store.Sandbox{}, false, fmt.Errorf("connect: %w", err)
	}
	end := time.Now().Add(t).UTC()
	switch sb.State {
	case store.StatePaused:
		if err := m.node.ResumeSandbox(ctx, id); err != nil {
			return store.Sandbox{}, false, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		if err := m.store.SetState(ctx, id, store.StateRunning, end); err != nil {
			return store.Sandbox{}, false, fmt.Errorf("connect: %w", err)
		}
		sb.State, sb.EndAt, resumed = store.StateRunning, end, true
		m.log.Info("sandbox resumed", "sandbox", id)
	default:
		if end.After(sb.EndAt) {
			if err := m.store.SetEndAt(ctx, id, end); err != nil {
				return store.Sandbox{}, false, fmt.Errorf("connect: %w", err)
			}
			sb.EndAt = end
		}
	}
	m.rearm()
	return sb, resumed, nil
}

// Pause freezes a running sandbox; errdefs.ErrConflict if already paused.
func (m *Master) Pause(ctx context.Context, id string) error {
	unlock := m.locks.lock(id)
	defer unlock()
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	if sb.State == store.StatePaused {
		return fmt.Errorf("pause sandbox %s: %w: already paused", id, errdefs.ErrConflict)
	}
	return m.pauseLocked(ctx, sb)
}

func (m *Master) pauseLocked(ctx context.Context, sb store.Sandbox) error {
	if err := m.node.PauseSandbox(ctx, sb.ID); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", sb.ID, err)
	}
	m.notifyGone(sb.ID)
	if err := m.store.SetState(context.WithoutCancel(ctx), sb.ID, store.StatePaused, sb.EndAt); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	m.log.Info("sandbox paused", "sandbox", sb.ID)
	return nil
}

// Metrics returns the sandbox's current resource usage.
func (m *Master) Metrics(ctx context.Context, id string) (nodeproto.Metrics, error) {
	if _, err := m.store.GetSandbox(ctx, id); err != nil {
		return nodeproto.Metrics{}, fmt.Errorf("metrics: %w", err)
	}
	mt, err := m.node.SandboxMetrics(ctx, id)
	if err != nil {
		return nodeproto.Metrics{}, fmt.Errorf("metrics of sandbox %s: %w", id, err)
	}
	if mt.Timestamp.IsZero() {
		mt.Timestamp = time.Now()
	}
	return mt, nil
}

// SandboxAddr resolves where the proxy sends traffic for a guest port. It
// fails with errdefs.ErrNotFound for an unknown sandbox and
// errdefs.ErrFailedPrecondition for a paused one.
func (m *Master) SandboxAddr(ctx context.Context, id string, port uint16) (string, error) {
	if !ValidSandboxID(id) {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return "", err
	}
	if sb.State != store.StateRunning {
		return "", fmt.Errorf("sandbox %s: %w: %s", id, errdefs.ErrFailedPrecondition, sb.State)
	}
	addr, err := m.node.SandboxAddr(ctx, id, port)
	if err != nil {
		return "", fmt.Errorf("sandbox %s port %d: %w", id, port, err)
	}
	return addr, nil
}
