package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// busySource is a server template source whose templates are all still
// being built (a built-in template on its first start).
type busySource struct{}

func (busySource) ServerTemplate(_ context.Context, name string) (TemplateRef, error) {
	return TemplateRef{}, fmt.Errorf("template %s is still being built: try again shortly: %w", name, errdefs.ErrUnavailable)
}

// A template the server source answers "still being built" (503) for is
// answered so, not "not found" (400): the SDK retries the first, not the
// second; a node that already has it is used all the same.
func TestLookupTemplateKeepsSourceErrors(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := NewRegistry(Config{ServerVersion: "v0.5.0", Templates: busySource{}}, DocumentNodes{Docs: st}, st)
	if err := r.Register(ctx, rec("n1", "v0.5.0")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Template(ctx, "code-interpreter-v1"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("template being built: %v", err)
	}
	if tpl, err := r.Template(ctx, "base"); err != nil || tpl.Name != "base" {
		t.Errorf("template on a node: %+v %v", tpl, err)
	}
}
