package roles

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
)

// A create of the built-in template waits for its build; other names are
// answered by the registry as before; a slow build answers 503 "still
// being built" and goes on.
func TestBuiltinSource(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: template import keeps owners")
	}
	ctx := context.Background()
	reg := &template.Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: t.TempDir()}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	b := template.NewBuilder(ctx, template.InterpName, func(ctx context.Context) (template.Template, error) {
		<-release
		return reg.ImportDir(ctx, template.InterpName, src)
	})
	s := builtinSource{TemplateSource: templatedist.Source{Registry: reg},
		builders: map[string]*template.Builder{template.InterpName: b}, wait: 50 * time.Millisecond}

	if _, err := s.ServerTemplate(ctx, "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown template: %v", err)
	}
	_, err := s.ServerTemplate(ctx, template.InterpName)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "still being built") {
		t.Fatalf("while building: %v", err)
	}
	close(release)
	s.wait = 30 * time.Second
	ref, err := s.ServerTemplate(ctx, template.InterpName)
	if err != nil || ref.Name != template.InterpName || ref.Digest == "" {
		t.Fatalf("after the build: %+v %v", ref, err)
	}
}

// A cluster server has no node to build the built-in template on: until
// its registry holds one, code-interpreter-v1 is answered with the default
// sizes (the node a create lands on builds it); other names stay unknown.
func TestBuiltinSourceWithoutNode(t *testing.T) {
	ctx := context.Background()
	reg := &template.Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: t.TempDir()}
	s := newBuiltinSource(ctx, reg, nil, true, nil, nil)
	ref, err := s.ServerTemplate(ctx, template.InterpName)
	if err != nil || ref.Name != template.InterpName || ref.CPUCount != template.DefaultCPUCount || ref.MemoryMB != template.DefaultMemoryMB {
		t.Fatalf("code-interpreter-v1 on a server without node: %+v %v", ref, err)
	}
	if _, err := s.ServerTemplate(ctx, "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown template: %v", err)
	}
}

// Recipe build sandboxes are hidden from the heartbeat while they run
// (the server does not know them), and only then.
func TestRecipeSandboxesHidden(t *testing.T) {
	var none *nodeSandboxes
	if none.hidden("x") {
		t.Error("nil hides")
	}
	n := newNodeSandboxes(nil)
	if _, err := n.CreateBuildSandbox(context.Background(), "base", 0, 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("create without a node: %v", err)
	}
	n.tokens[buildIDPrefix+"1"] = "t"
	if !n.hidden(buildIDPrefix+"1") || n.hidden("other") {
		t.Error("hidden")
	}
	n.forget(buildIDPrefix + "1")
	if n.hidden(buildIDPrefix + "1") {
		t.Error("still hidden after it is gone")
	}
}

// drain waits for running recipe builds to kill their sandboxes, within
// its bound.
func TestRecipeSandboxesDrain(t *testing.T) {
	n := newNodeSandboxes(nil)
	n.drain(time.Second) // none: at once
	n.tokens["recipe-build-1"] = "t"
	go func() { time.Sleep(100 * time.Millisecond); n.forget("recipe-build-1") }()
	start := time.Now()
	n.drain(10 * time.Second)
	if d := time.Since(start); d < 90*time.Millisecond || d > 5*time.Second || n.hidden("recipe-build-1") {
		t.Errorf("drain returned after %s", d)
	}
	n.tokens["recipe-build-2"] = "t"
	start = time.Now()
	n.drain(200 * time.Millisecond)
	if d := time.Since(start); d < 200*time.Millisecond || d > 5*time.Second {
		t.Errorf("bounded drain returned after %s", d)
	}
}
