package master

import (
	"context"
	"errors"
	"time"

	"github.com/cube-dev/cube/internal/leader"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// The expiry loop is the master's TTL job: it kills (or, with auto-pause,
// pauses) every running sandbox whose endAt has passed. (The sandbox's pid
// 1, cube-reaper, and the cubelet's sweep of dead sandboxes are other
// jobs.)

// expiryRetry is how long the expiry loop waits before retrying a sandbox
// whose kill/pause failed, or the store after an error.
const expiryRetry = 5 * time.Second

// sharedExpiryPoll bounds the expiry loop's sleep when other replicas
// share the store (Config.Elector set).
const sharedExpiryPoll = time.Second

// runExpiry runs the expiry loop, with an elector only while this replica
// leads.
func (m *Master) runExpiry(ctx context.Context) {
	defer close(m.done)
	if m.cfg.Elector == nil {
		m.expiryLoop(ctx)
		return
	}
	err := leader.Run(ctx, m.cfg.Elector, func(ctx context.Context) error {
		m.log.Info("expiry loop leads")
		m.expiryLoop(ctx)
		if cause := context.Cause(ctx); errors.Is(cause, leader.ErrLost) {
			m.log.Warn("expiry loop stopped: leadership lost", "err", cause)
		}
		return nil
	})
	if err != nil {
		m.log.Error("expiry: leader election failed; this replica will not expire sandboxes", "err", err)
	}
}

// expiryLoop is the TTL loop: one timer armed on the earliest endAt of a
// running sandbox, re-armed whenever rearm is called.
func (m *Master) expiryLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	backoff := map[string]time.Time{}
	for {
		wake := m.expireDue(ctx, backoff)
		if poll := time.Now().Add(sharedExpiryPoll); m.cfg.Elector != nil && (wake.IsZero() || wake.After(poll)) {
			wake = poll
		}
		if !wake.IsZero() {
			timer.Reset(max(time.Until(wake), 0))
		}
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// expireDue handles every expired sandbox and returns when to wake next
// (zero = nothing scheduled).
func (m *Master) expireDue(ctx context.Context, backoff map[string]time.Time) time.Time {
	now := time.Now()
	expired, err := m.store.ExpiredSandboxes(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Error("expiry: list expired sandboxes", "err", err)
		}
		return now.Add(expiryRetry)
	}
	var wake time.Time
	earlier := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	seen := make(map[string]bool, len(expired))
	for _, sb := range expired {
		seen[sb.ID] = true
		if at, ok := backoff[sb.ID]; ok && at.After(now) {
			earlier(at)
			continue
		}
		if err := m.expire(ctx, sb.ID, now); err != nil {
			if ctx.Err() != nil {
				return time.Time{}
			}
			m.log.Error("expiry: expire sandbox", "sandbox", sb.ID, "err", err)
			backoff[sb.ID] = now.Add(expiryRetry)
			earlier(backoff[sb.ID])
			continue
		}
		delete(backoff, sb.ID)
	}
	for id := range backoff {
		if !seen[id] {
			delete(backoff, id)
		}
	}
	next, ok, err := m.store.NextEndAt(ctx, now)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			m.log.Error("expiry: next end", "err", err)
		}
		earlier(now.Add(expiryRetry))
	case ok:
		earlier(next)
	}
	return wake
}

// expire kills or pauses one sandbox if it is still running and past its end
// (a concurrent setTimeout/connect may have extended it).
func (m *Master) expire(ctx context.Context, id string, now time.Time) error {
	unlock := m.locks.lock(id)
	defer unlock()
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil || sb.State != store.StateRunning || sb.EndAt.After(now) {
		return nil // gone, paused or extended meanwhile
	}
	if sb.Lifecycle.OnTimeout == "pause" {
		m.log.Info("sandbox timed out, pausing", "sandbox", id)
		return m.pauseLocked(ctx, sb)
	}
	m.log.Info("sandbox timed out, killing", "sandbox", id)
	return m.killLocked(nodeproto.WithKillReason(ctx, nodeproto.KillReasonTimeout), id)
}
