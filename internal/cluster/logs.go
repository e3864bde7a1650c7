package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// SandboxLogs reads a sandbox's log on its node. A sandbox that has ended
// has no record any more, but its node keeps the log for a while: then
// every node that is not Down is asked, and the first that has it answers.
func (r *Registry) SandboxLogs(ctx context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error) {
	n, cl, err := r.liveClient(ctx, id)
	switch {
	case err == nil:
		var out []nodeproto.LogEntry
		err = r.call(ctx, n, cl, func(cl *nodeapi.Client) (err error) {
			out, err = cl.SandboxLogs(ctx, id, q)
			return err
		})
		return out, err
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, err
	}
	type target struct {
		n  *node
		cl *nodeapi.Client
	}
	r.mu.Lock()
	targets := make([]target, 0, len(r.nodes))
	for _, n := range r.nodes {
		if !n.down && n.client != nil {
			targets = append(targets, target{n, n.client})
		}
	}
	r.mu.Unlock()
	var errs []error
	for _, t := range targets {
		var out []nodeproto.LogEntry
		err := r.call(ctx, t.n, t.cl, func(cl *nodeapi.Client) (err error) {
			out, err = cl.SandboxLogs(ctx, id, q)
			return err
		})
		if err == nil {
			return out, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrNotImplemented) {
			errs = append(errs, fmt.Errorf("node %s: %w", t.n.rec.ID, err))
		}
	}
	if len(errs) > 0 {
		// A node that could not answer may be the one with the log.
		return nil, fmt.Errorf("logs of sandbox %s: %w", id, errors.Join(errs...))
	}
	return nil, fmt.Errorf("sandbox %s is not running and no node keeps its logs (they are kept for a while after a sandbox ends): %w", id, errdefs.ErrNotFound)
}
