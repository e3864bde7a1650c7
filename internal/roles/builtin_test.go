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
