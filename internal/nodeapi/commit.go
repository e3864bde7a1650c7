package nodeapi

import (
	"context"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// CommitSandbox registers the filesystem of a running WritableOnHost
// sandbox as a template on its node.
func (c *Client) CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) (nodeproto.Template, error) {
	res, err := c.rpc.CommitSandbox(ctx, connect.NewRequest(commitToProto(req)))
	if err != nil {
		return nodeproto.Template{}, FromConnect(err)
	}
	return templateFromProto(res.Msg.GetTemplate()), nil
}

func (s *cubeletServer) CommitSandbox(ctx context.Context, req *connect.Request[nodev1.CommitSandboxRequest]) (*connect.Response[nodev1.CommitSandboxResponse], error) {
	t, err := s.c.CommitSandbox(ctx, commitFromProto(req.Msg))
	if err != nil {
		return nil, ToConnect(err)
	}
	return connect.NewResponse(&nodev1.CommitSandboxResponse{Template: templateToProto(t)}), nil
}

func commitToProto(r nodeproto.CommitRequest) *nodev1.CommitSandboxRequest {
	d := r.Defaults
	return &nodev1.CommitSandboxRequest{
		SandboxId: r.SandboxID, Name: r.Name, CpuCount: int32(r.CPUCount), MemoryMb: int32(r.MemoryMB),
		Defaults: &nodev1.TemplateDefaults{Env: d.Env, Workdir: d.Workdir, User: d.User, StartCmd: d.StartCmd, ReadyCmd: d.ReadyCmd},
	}
}

func commitFromProto(p *nodev1.CommitSandboxRequest) nodeproto.CommitRequest {
	d := p.GetDefaults()
	return nodeproto.CommitRequest{
		SandboxID: p.GetSandboxId(), Name: p.GetName(), CPUCount: int(p.GetCpuCount()), MemoryMB: int(p.GetMemoryMb()),
		Defaults: nodeproto.TemplateDefaults{
			Env: d.GetEnv(), Workdir: d.GetWorkdir(), User: d.GetUser(), StartCmd: d.GetStartCmd(), ReadyCmd: d.GetReadyCmd(),
		},
	}
}

func templateToProto(t nodeproto.Template) *nodev1.Template {
	return &nodev1.Template{Name: t.Name, Digest: t.Digest, CpuCount: int32(t.CPUCount), MemoryMb: int32(t.MemoryMB),
		DiskSizeMb: int32(t.DiskSizeMB), Layers: t.Layers, DefaultsJson: t.DefaultsJSON}
}

func templateFromProto(p *nodev1.Template) nodeproto.Template {
	return nodeproto.Template{Name: p.GetName(), Digest: p.GetDigest(), CPUCount: int(p.GetCpuCount()),
		MemoryMB: int(p.GetMemoryMb()), DiskSizeMB: int(p.GetDiskSizeMb()), Layers: p.GetLayers(),
		DefaultsJSON: p.GetDefaultsJson()}
}

// DeleteTemplate removes a template from the node.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	_, err := c.rpc.DeleteTemplate(ctx, connect.NewRequest(&nodev1.TemplateName{Name: name}))
	return FromConnect(err)
}

func (s *cubeletServer) DeleteTemplate(ctx context.Context, req *connect.Request[nodev1.TemplateName]) (*connect.Response[nodev1.Empty], error) {
	if err := s.c.DeleteTemplate(ctx, req.Msg.GetName()); err != nil {
		return nil, ToConnect(err)
	}
	return connect.NewResponse(&nodev1.Empty{}), nil
}
