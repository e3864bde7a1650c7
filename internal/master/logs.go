package master

import (
	"context"
	"fmt"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// LogReader is implemented by nodes that keep sandbox logs (the cluster
// registry does). Without it, Logs answers errdefs.ErrNotImplemented.
type LogReader interface {
	SandboxLogs(ctx context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error)
}

// Logs returns lines of a sandbox's log: while it runs or is paused, and
// for the node's retention after it ended (when the store has forgotten
// it, the node still has them).
func (m *Master) Logs(ctx context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error) {
	if !ValidSandboxID(id) {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if !nodeproto.ValidLogLevel(q.MinLevel) {
		return nil, fmt.Errorf("log level %q (want debug, info, warn or error): %w", q.MinLevel, errdefs.ErrInvalidArgument)
	}
	lr, ok := m.node.(LogReader)
	if !ok {
		return nil, fmt.Errorf("sandbox logs: %w", errdefs.ErrNotImplemented)
	}
	entries, err := lr.SandboxLogs(ctx, id, q)
	if err != nil {
		return nil, fmt.Errorf("logs of sandbox %s: %w", id, err)
	}
	return entries, nil
}
