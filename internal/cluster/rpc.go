package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/api/gen/node/v1/nodev1connect"
	"github.com/cube-dev/cube/internal/nodeapi"
)

// KeyVerifier checks an API key (the server's key store).
type KeyVerifier interface {
	VerifyKey(ctx context.Context, plaintext string) (string, error)
}

type registryServer struct{ r *Registry }

// NewRegistryService returns RegistryService for r without a transport:
// an all-in-one Cube's in-process node registers and heartbeats through it
// exactly as a remote cubelet does through NewRegistryHandler.
func NewRegistryService(r *Registry) nodev1connect.RegistryServiceClient {
	return &registryServer{r: r}
}

// NewRegistryHandler serves RegistryService for cubelets. A cubelet that
// presents an API key (X-API-Key or Authorization: Bearer) must present a
// valid one; with requireKey, every cubelet must. (The server reaches each
// cubelet with the per-node token it registered, whatever this setting.)
func NewRegistryHandler(r *Registry, keys KeyVerifier, requireKey bool) (string, http.Handler) {
	path, h := nodev1connect.NewRegistryServiceHandler(&registryServer{r: r})
	return path, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		key := req.Header.Get("X-API-Key")
		if key == "" {
			key, _ = strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		}
		if key == "" && !requireKey {
			h.ServeHTTP(w, req)
			return
		}
		if _, err := keys.VerifyKey(req.Context(), key); key == "" || err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"code":"unauthenticated","message":"a valid API key is required to register a node"}`))
			return
		}
		h.ServeHTTP(w, req)
	})
}

func templatesFromProto(ts []*nodev1.Template) []TemplateRef {
	if ts == nil {
		return nil
	}
	out := make([]TemplateRef, 0, len(ts))
	for _, t := range ts {
		out = append(out, TemplateRef{Name: t.Name, Digest: t.Digest, CPUCount: int(t.CpuCount), MemoryMB: int(t.MemoryMb), DiskSizeMB: int(t.DiskSizeMb),
			Layers: t.Layers, Defaults: json.RawMessage(t.DefaultsJson)})
	}
	return out
}

func (s *registryServer) Register(ctx context.Context, req *connect.Request[nodev1.RegisterRequest]) (*connect.Response[nodev1.RegisterResponse], error) {
	n := req.Msg.GetNode()
	c := n.GetCapacity()
	rec := NodeRecord{
		ID: n.GetNodeId(), Version: n.GetVersion(), RPCURL: n.GetRpcUrl(), DataIP: n.GetDataIp(), Token: n.GetToken(),
		Capacity: Capacity{CPUCount: int(c.GetCpuCount()), MemoryMB: c.GetMemoryMb(), MaxSandboxes: int(c.GetMaxSandboxes()), MaxCreates: int(c.GetMaxCreates()),
			MemoryReserveMB: c.GetMemoryReserveMb()},
		Templates: templatesFromProto(n.GetTemplates()),
		Health:    healthFromProto(n.GetHealth()),
	}
	if err := s.r.Register(ctx, rec); err != nil {
		return nil, nodeapi.ToConnect(err)
	}
	return connect.NewResponse(&nodev1.RegisterResponse{
		ServerVersion: s.r.cfg.ServerVersion, HeartbeatIntervalMs: s.r.cfg.HeartbeatInterval.Milliseconds(),
	}), nil
}

func (s *registryServer) Heartbeat(ctx context.Context, req *connect.Request[nodev1.HeartbeatRequest]) (*connect.Response[nodev1.HeartbeatResponse], error) {
	kill, rereg, err := s.r.Heartbeat(ctx, req.Msg.NodeId, req.Msg.SandboxIds, templatesFromProto(req.Msg.Templates), healthFromProto(req.Msg.Health))
	if err != nil {
		return nil, nodeapi.ToConnect(err)
	}
	if u := req.Msg.GetUsage(); u != nil && !rereg {
		s.r.RecordUsage(req.Msg.NodeId, NodeUsage{MemoryAvailableMB: u.GetMemoryAvailableMb(), SandboxResidentMB: u.GetSandboxResidentMb(),
			Sandboxes: int(u.GetSandboxes()), CPUUsedMilli: int(u.GetCpuUsedMilli()), CPUs: int(u.GetCpus())})
	}
	return connect.NewResponse(&nodev1.HeartbeatResponse{KillSandboxIds: kill, Reregister: rereg}), nil
}
