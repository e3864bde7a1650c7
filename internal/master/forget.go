package master

import (
	"context"
	"fmt"
)

// Forget drops the record of a sandbox that no longer exists on its node
// (lost with the node, or the node was deleted) without asking the node.
func (m *Master) Forget(ctx context.Context, id string) error {
	unlock := m.locks.lock(id)
	defer unlock()
	if _, err := m.store.GetSandbox(ctx, id); err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	m.notifyGone(id)
	if err := m.store.DeleteSandbox(context.WithoutCancel(ctx), id); err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	m.log.Warn("sandbox forgotten", "sandbox", id)
	return nil
}
