package nodeapi

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// LogReader is implemented by node agents that keep sandbox logs. It is
// apart from Cubelet so that agents (and test doubles) without logs still
// serve the rest of the protocol; SandboxLogs then answers Unimplemented.
type LogReader interface {
	SandboxLogs(ctx context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error)
}

// killReasonHeader carries nodeproto.KillReason over the wire.
const killReasonHeader = "Cube-Kill-Reason"

// maxKillReason bounds a kill reason taken from a request header.
const maxKillReason = 200

// withKillReason puts a KillSandbox request's reason header into ctx
// (an in-process call already has it there).
func withKillReason(ctx context.Context, h string) context.Context {
	if h == "" || nodeproto.KillReason(ctx) != "" {
		return ctx
	}
	if len(h) > maxKillReason {
		h = h[:maxKillReason]
	}
	return nodeproto.WithKillReason(ctx, h)
}

// SandboxLogs reads lines of a sandbox's log on the node.
func (c *Client) SandboxLogs(ctx context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error) {
	req := &nodev1.SandboxLogsRequest{
		SandboxId: id, Backward: q.Backward, Limit: int32(min(q.Limit, nodeproto.MaxLogLimit)),
		MinLevel: q.MinLevel, Search: q.Search,
	}
	if !q.Cursor.IsZero() {
		req.CursorUnixMs = q.Cursor.UnixMilli()
	}
	res, err := c.rpc.SandboxLogs(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, FromConnect(err)
	}
	out := make([]nodeproto.LogEntry, 0, len(res.Msg.Entries))
	for _, e := range res.Msg.Entries {
		out = append(out, nodeproto.LogEntry{
			Time: time.UnixMilli(e.TimestampUnixMs).UTC(), Level: e.Level, Logger: e.Logger,
			Message: e.Message, Fields: e.Fields,
		})
	}
	return out, nil
}

func (s *cubeletServer) SandboxLogs(ctx context.Context, req *connect.Request[nodev1.SandboxLogsRequest]) (*connect.Response[nodev1.SandboxLogsResponse], error) {
	lr, ok := s.c.(LogReader)
	if !ok {
		return nil, ToConnect(fmt.Errorf("this node keeps no sandbox logs: %w", errdefs.ErrNotImplemented))
	}
	m := req.Msg
	if !nodeproto.ValidLogLevel(m.MinLevel) {
		return nil, ToConnect(fmt.Errorf("log level %q: %w", m.MinLevel, errdefs.ErrInvalidArgument))
	}
	q := nodeproto.LogQuery{Backward: m.Backward, Limit: int(m.Limit), MinLevel: m.MinLevel, Search: m.Search}
	if m.CursorUnixMs != 0 {
		q.Cursor = time.UnixMilli(m.CursorUnixMs)
	}
	entries, err := lr.SandboxLogs(ctx, m.SandboxId, q)
	if err != nil {
		return nil, ToConnect(err)
	}
	out := &nodev1.SandboxLogsResponse{Entries: make([]*nodev1.SandboxLogEntry, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, &nodev1.SandboxLogEntry{
			TimestampUnixMs: e.Time.UnixMilli(), Level: e.Level, Logger: e.Logger, Message: e.Message, Fields: e.Fields,
		})
	}
	return connect.NewResponse(out), nil
}
