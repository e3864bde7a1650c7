package nodeapi

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/api/gen/node/v1/nodev1connect"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// Cubelet is what the CubeletService handler needs from the node agent.
type Cubelet interface {
	CreateSandbox(ctx context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error)
	KillSandbox(ctx context.Context, id string) error
	HostPort(ctx context.Context, id string, port uint16) (uint16, error)
	SandboxMetrics(ctx context.Context, id string) (nodeproto.Metrics, error)
	PauseSandbox(ctx context.Context, id string) error
	ResumeSandbox(ctx context.Context, id string) error
	UpdateEgress(ctx context.Context, id string, p nodeproto.EgressPolicy) error
	Sandboxes(ctx context.Context) ([]nodeproto.Sandbox, error)
	CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) (nodeproto.Template, error)
	DeleteTemplate(ctx context.Context, name string) error
}

// InfoFunc returns the node's current identity, capacity and templates.
type InfoFunc func(ctx context.Context) (*nodev1.NodeInfo, error)

type cubeletServer struct {
	c    Cubelet
	info InfoFunc
}

// NewCubeletHandler serves CubeletService for c. Every call must carry
// `Authorization: Bearer <token>` (the token the cubelet registered with).
func NewCubeletHandler(c Cubelet, info InfoFunc, token string) (string, http.Handler) {
	path, h := nodev1connect.NewCubeletServiceHandler(&cubeletServer{c: c, info: info})
	return path, requireBearer(token, h)
}

// requireBearer rejects requests without the expected bearer token.
func requireBearer(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if token == "" || !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"code":"unauthenticated","message":"missing or wrong node token"}`))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *cubeletServer) GetInfo(ctx context.Context, _ *connect.Request[nodev1.Empty]) (*connect.Response[nodev1.NodeInfo], error) {
	info, err := s.info(ctx)
	if err != nil {
		return nil, ToConnect(err)
	}
	return connect.NewResponse(info), nil
}

func (s *cubeletServer) CreateSandbox(ctx context.Context, req *connect.Request[nodev1.CreateSandboxRequest]) (*connect.Response[nodev1.CreateSandboxResponse], error) {
	m := req.Msg
	sb, err := s.c.CreateSandbox(ctx, nodeproto.CreateRequest{
		SandboxID: m.SandboxId, Template: m.Template, CPUCount: int(m.CpuCount), MemoryMB: int(m.MemoryMb),
		EnvVars: m.EnvVars, EnvdAccessToken: m.EnvdAccessToken, AllowInternet: m.AllowInternet,
		NodeMayChooseToken: m.NodeMayChooseToken, WritableOnHost: m.WritableOnHost,
	})
	if err != nil {
		return nil, ToConnect(err)
	}
	return connect.NewResponse(&nodev1.CreateSandboxResponse{Sandbox: sandboxToProto(sb)}), nil
}

func (s *cubeletServer) KillSandbox(ctx context.Context, req *connect.Request[nodev1.SandboxRef]) (*connect.Response[nodev1.Empty], error) {
	return empty(s.c.KillSandbox(withKillReason(ctx, req.Header().Get(killReasonHeader)), req.Msg.SandboxId))
}

func (s *cubeletServer) MapPort(ctx context.Context, req *connect.Request[nodev1.MapPortRequest]) (*connect.Response[nodev1.MapPortResponse], error) {
	if req.Msg.GuestPort == 0 || req.Msg.GuestPort > 65535 {
		return nil, ToConnect(errdefs.ErrInvalidArgument)
	}
	hp, err := s.c.HostPort(ctx, req.Msg.SandboxId, uint16(req.Msg.GuestPort))
	if err != nil {
		return nil, ToConnect(err)
	}
	return connect.NewResponse(&nodev1.MapPortResponse{HostPort: uint32(hp)}), nil
}

func (s *cubeletServer) GetMetrics(ctx context.Context, req *connect.Request[nodev1.SandboxRef]) (*connect.Response[nodev1.Metrics], error) {
	m, err := s.c.SandboxMetrics(ctx, req.Msg.SandboxId)
	if err != nil {
		return nil, ToConnect(err)
	}
	return connect.NewResponse(&nodev1.Metrics{
		TimestampUnixMs: m.Timestamp.UnixMilli(), CpuCount: int32(m.CPUCount), CpuUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal,
	}), nil
}

func (s *cubeletServer) PauseSandbox(ctx context.Context, req *connect.Request[nodev1.SandboxRef]) (*connect.Response[nodev1.Empty], error) {
	return empty(s.c.PauseSandbox(ctx, req.Msg.SandboxId))
}

func (s *cubeletServer) ResumeSandbox(ctx context.Context, req *connect.Request[nodev1.SandboxRef]) (*connect.Response[nodev1.Empty], error) {
	return empty(s.c.ResumeSandbox(ctx, req.Msg.SandboxId))
}

func (s *cubeletServer) UpdateEgress(ctx context.Context, req *connect.Request[nodev1.EgressRequest]) (*connect.Response[nodev1.Empty], error) {
	allow, err := nodeproto.ParsePrefixes(req.Msg.AllowOut)
	if err != nil {
		return nil, ToConnect(err)
	}
	deny, err := nodeproto.ParsePrefixes(req.Msg.DenyOut)
	if err != nil {
		return nil, ToConnect(err)
	}
	return empty(s.c.UpdateEgress(ctx, req.Msg.SandboxId, nodeproto.EgressPolicy{
		AllowInternet: req.Msg.AllowInternet, AllowOut: allow, DenyOut: deny,
	}))
}

func (s *cubeletServer) ListSandboxes(ctx context.Context, _ *connect.Request[nodev1.Empty]) (*connect.Response[nodev1.ListSandboxesResponse], error) {
	sbs, err := s.c.Sandboxes(ctx)
	if err != nil {
		return nil, ToConnect(err)
	}
	out := &nodev1.ListSandboxesResponse{}
	for _, sb := range sbs {
		out.Sandboxes = append(out.Sandboxes, sandboxToProto(sb))
	}
	return connect.NewResponse(out), nil
}

func empty(err error) (*connect.Response[nodev1.Empty], error) {
	if err != nil {
		return nil, ToConnect(err)
	}
	return connect.NewResponse(&nodev1.Empty{}), nil
}

func sandboxToProto(sb nodeproto.Sandbox) *nodev1.Sandbox {
	return &nodev1.Sandbox{
		SandboxId: sb.ID, Template: sb.Template, Ip: sb.IP.String(), EnvdVersion: sb.EnvdVersion,
		CpuCount: int32(sb.CPUCount), MemoryMb: int32(sb.MemoryMB), DiskSizeMb: int32(sb.DiskSizeMB),
		StartedAtUnixMs: sb.StartedAt.UnixMilli(), EnvdAccessToken: sb.EnvdAccessToken,
	}
}

func sandboxFromProto(p *nodev1.Sandbox) nodeproto.Sandbox {
	sb := nodeproto.Sandbox{
		ID: p.GetSandboxId(), Template: p.GetTemplate(), EnvdVersion: p.GetEnvdVersion(),
		CPUCount: int(p.GetCpuCount()), MemoryMB: int(p.GetMemoryMb()), DiskSizeMB: int(p.GetDiskSizeMb()),
		StartedAt: time.UnixMilli(p.GetStartedAtUnixMs()).UTC(), EnvdAccessToken: p.GetEnvdAccessToken(),
	}
	sb.IP, _ = parseAddr(p.GetIp())
	return sb
}
