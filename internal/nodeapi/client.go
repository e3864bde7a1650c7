package nodeapi

import (
	"context"
	"net/http"
	"net/netip"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/api/gen/node/v1/nodev1connect"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// Client calls one cubelet's CubeletService. Errors come back as errdefs
// kinds (see FromConnect).
type Client struct {
	rpc nodev1connect.CubeletServiceClient
	// local is the node agent of an in-process client, nil otherwise.
	local Cubelet
}

// NewClient returns a client for the cubelet at baseURL that authenticates
// with token.
func NewClient(hc *http.Client, baseURL, token string) *Client {
	return &Client{rpc: nodev1connect.NewCubeletServiceClient(hc, baseURL,
		connect.WithInterceptors(bearer(token)))}
}

// bearer puts the node token on every call, unary and streaming (a
// connect.UnaryInterceptorFunc would leave streams without it).
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Info asks the cubelet for its identity, capacity and templates (also the
// server's liveness probe).
func (c *Client) Info(ctx context.Context) (*nodev1.NodeInfo, error) {
	res, err := c.rpc.GetInfo(ctx, connect.NewRequest(&nodev1.Empty{}))
	if err != nil {
		return nil, FromConnect(err)
	}
	return res.Msg, nil
}

// CreateSandbox creates a sandbox on the node.
func (c *Client) CreateSandbox(ctx context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error) {
	res, err := c.rpc.CreateSandbox(ctx, connect.NewRequest(&nodev1.CreateSandboxRequest{
		SandboxId: req.SandboxID, Template: req.Template, CpuCount: int32(req.CPUCount), MemoryMb: int32(req.MemoryMB),
		EnvVars: req.EnvVars, EnvdAccessToken: req.EnvdAccessToken, AllowInternet: req.AllowInternet,
		NodeMayChooseToken: req.NodeMayChooseToken, WritableOnHost: req.WritableOnHost,
	}))
	if err != nil {
		return nodeproto.Sandbox{}, FromConnect(err)
	}
	return sandboxFromProto(res.Msg.GetSandbox()), nil
}

// KillSandbox removes a sandbox from the node.
func (c *Client) KillSandbox(ctx context.Context, id string) error {
	req := connect.NewRequest(&nodev1.SandboxRef{SandboxId: id})
	if r := nodeproto.KillReason(ctx); r != "" {
		req.Header().Set(killReasonHeader, r)
	}
	_, err := c.rpc.KillSandbox(ctx, req)
	return FromConnect(err)
}

// HostPort returns the node's host port for a sandbox's guest port.
func (c *Client) HostPort(ctx context.Context, id string, port uint16) (uint16, error) {
	res, err := c.rpc.MapPort(ctx, connect.NewRequest(&nodev1.MapPortRequest{SandboxId: id, GuestPort: uint32(port)}))
	if err != nil {
		return 0, FromConnect(err)
	}
	return uint16(res.Msg.HostPort), nil
}

// SandboxMetrics reads a sandbox's counters on the node.
func (c *Client) SandboxMetrics(ctx context.Context, id string) (nodeproto.Metrics, error) {
	res, err := c.rpc.GetMetrics(ctx, connect.NewRequest(&nodev1.SandboxRef{SandboxId: id}))
	if err != nil {
		return nodeproto.Metrics{}, FromConnect(err)
	}
	m := res.Msg
	return nodeproto.Metrics{
		Timestamp: time.UnixMilli(m.TimestampUnixMs).UTC(), CPUCount: int(m.CpuCount), CPUUsedPct: m.CpuUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
	}, nil
}

// PauseSandbox freezes a sandbox.
func (c *Client) PauseSandbox(ctx context.Context, id string) error {
	_, err := c.rpc.PauseSandbox(ctx, connect.NewRequest(&nodev1.SandboxRef{SandboxId: id}))
	return FromConnect(err)
}

// ResumeSandbox thaws a sandbox.
func (c *Client) ResumeSandbox(ctx context.Context, id string) error {
	_, err := c.rpc.ResumeSandbox(ctx, connect.NewRequest(&nodev1.SandboxRef{SandboxId: id}))
	return FromConnect(err)
}

// UpdateEgress replaces a sandbox's egress policy.
func (c *Client) UpdateEgress(ctx context.Context, id string, allowInternet bool, allowOut, denyOut []string) error {
	_, err := c.rpc.UpdateEgress(ctx, connect.NewRequest(&nodev1.EgressRequest{
		SandboxId: id, AllowInternet: allowInternet, AllowOut: allowOut, DenyOut: denyOut,
	}))
	return FromConnect(err)
}

// Sandboxes lists the sandboxes running on the node.
func (c *Client) Sandboxes(ctx context.Context) ([]nodeproto.Sandbox, error) {
	res, err := c.rpc.ListSandboxes(ctx, connect.NewRequest(&nodev1.Empty{}))
	if err != nil {
		return nil, FromConnect(err)
	}
	out := make([]nodeproto.Sandbox, 0, len(res.Msg.Sandboxes))
	for _, p := range res.Msg.Sandboxes {
		out = append(out, sandboxFromProto(p))
	}
	return out, nil
}

func parseAddr(s string) (netip.Addr, error) { return netip.ParseAddr(s) }
