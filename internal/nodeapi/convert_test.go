package nodeapi

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// TestSandboxSurvivesTheWire: every field of a node's sandbox view,
// including the envd token a node chose at create, crosses the node API.
func TestSandboxSurvivesTheWire(t *testing.T) {
	in := nodeproto.Sandbox{
		ID: "abc", Template: "base", IP: netip.MustParseAddr("10.222.0.9"), EnvdVersion: "0.5.7",
		CPUCount: 2, MemoryMB: 512, DiskSizeMB: 2048, StartedAt: time.UnixMilli(1_700_000_000_123).UTC(),
		EnvdAccessToken: "0123456789abcdef",
	}
	if out := sandboxFromProto(sandboxToProto(in)); out != in {
		t.Fatalf("after the wire: %+v, want %+v", out, in)
	}
}

// TestCommitSurvivesTheWire: a commit request (with every default) and the
// template it answers with cross the node API unchanged, and a create's
// WritableOnHost reaches the node.
func TestCommitSurvivesTheWire(t *testing.T) {
	in := nodeproto.CommitRequest{
		SandboxID: "abc", Name: "built.step-3", CPUCount: 4, MemoryMB: 2048,
		Defaults: nodeproto.TemplateDefaults{
			Env: map[string]string{"A": "1", "PATH": "/x:/usr/bin"}, Workdir: "/app", User: "root",
			StartCmd: "python -m http.server 8000", ReadyCmd: "curl -fs localhost:8000",
		},
	}
	if out := commitFromProto(commitToProto(in)); !reflect.DeepEqual(out, in) {
		t.Fatalf("commit request after the wire: %+v, want %+v", out, in)
	}
	// Unset defaults stay unset (an old server sends none).
	if out := commitFromProto(&nodev1.CommitSandboxRequest{SandboxId: "x", Name: "y"}); !reflect.DeepEqual(out.Defaults, nodeproto.TemplateDefaults{}) {
		t.Fatalf("no defaults came back as %+v", out.Defaults)
	}
	tpl := nodeproto.Template{Name: "built", Digest: "sha256:00ff", CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024,
		Layers: []string{"sha256:aa", "sha256:bb"}, DefaultsJSON: []byte(`{"env":{"A":"1"}}`)}
	if out := templateFromProto(templateToProto(tpl)); !reflect.DeepEqual(out, tpl) {
		t.Fatalf("template after the wire: %+v, want %+v", out, tpl)
	}
}

// commitNode is a node that records what reaches it.
type commitNode struct {
	Cubelet
	create nodeproto.CreateRequest
	commit nodeproto.CommitRequest
}

func (n *commitNode) CreateSandbox(_ context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error) {
	n.create = req
	return nodeproto.Sandbox{ID: req.SandboxID}, nil
}

func (n *commitNode) CommitSandbox(_ context.Context, req nodeproto.CommitRequest) (nodeproto.Template, error) {
	n.commit = req
	if req.SandboxID == "gone" {
		return nodeproto.Template{}, fmt.Errorf("sandbox gone: %w", errdefs.ErrNotFound)
	}
	return nodeproto.Template{Name: req.Name, Digest: "sha256:aa", CPUCount: 1, MemoryMB: 256, DiskSizeMB: 1024}, nil
}

// TestCommitThroughTheHandler: the in-process client goes through the same
// handler as a remote server; fields and error kinds arrive.
func TestCommitThroughTheHandler(t *testing.T) {
	n := &commitNode{}
	cl := NewInProcessClient(n, nil)
	ctx := context.Background()
	if _, err := cl.CreateSandbox(ctx, nodeproto.CreateRequest{SandboxID: "b1", Template: "base", WritableOnHost: true}); err != nil {
		t.Fatal(err)
	}
	if !n.create.WritableOnHost {
		t.Fatal("WritableOnHost did not reach the node")
	}
	req := nodeproto.CommitRequest{SandboxID: "b1", Name: "t1", Defaults: nodeproto.TemplateDefaults{User: "root"}}
	got, err := cl.CommitSandbox(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "t1" || got.Digest != "sha256:aa" || n.commit.Defaults.User != "root" {
		t.Fatalf("commit: got %+v, node saw %+v", got, n.commit)
	}
	if _, err := cl.CommitSandbox(ctx, nodeproto.CommitRequest{SandboxID: "gone", Name: "t1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("commit of a missing sandbox: %v, want NotFound", err)
	}
}
