package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// mapSource is a server template source of fixed templates, as
// templatedist.Source reports them (a store record: its layers, and the
// name of its bottom template when it has several).
type mapSource map[string]TemplateRef

func (m mapSource) ServerTemplate(_ context.Context, name string) (TemplateRef, error) {
	if t, ok := m[name]; ok {
		return t, nil
	}
	return TemplateRef{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
}

// TestSupplyOfImageRecords: an image template a server replica recorded
// in the store (one layer, no base) is fetchable by every node, even one
// holding no template; a template built on it (its bottom layer the
// image's) is fetchable by a bare node because the server ships its base;
// once the image's record is gone, only nodes holding its bottom layer
// can fetch it.
func TestSupplyOfImageRecords(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const img, top = "sha256:image", "sha256:top"
	src := mapSource{
		"image-0123456789abcdef": {Name: "image-0123456789abcdef", Digest: img, Layers: []string{img}, CPUCount: 1, MemoryMB: 256},
		"app":                    {Name: "app", Digest: "sha256:app", Layers: []string{img, top}, Base: "image-0123456789abcdef", CPUCount: 1, MemoryMB: 256},
	}
	r := NewRegistry(Config{ServerVersion: "v0.5.0", Templates: src}, DocumentNodes{Docs: st}, st)
	bare := rec("bare", "v0.5.0")
	bare.Templates = nil
	holder := rec("holder", "v0.5.0")
	holder.Templates = []TemplateRef{{Name: "image-0123456789abcdef", Digest: img}}
	for _, n := range []NodeRecord{bare, holder} {
		if err := r.Register(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	fetchable := func(name string) map[string]bool {
		t.Helper()
		_, sup, err := r.lookupTemplate(ctx, name)
		if err != nil {
			t.Fatalf("lookup %s: %v", name, err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		out := map[string]bool{}
		for _, c := range r.candidatesLocked(name, sup) {
			out[c.ID] = c.Fetchable || c.HasTemplate
		}
		return out
	}
	for _, name := range []string{"image-0123456789abcdef", "app"} {
		if got := fetchable(name); !got["bare"] || !got["holder"] {
			t.Errorf("%s: nodes able to run it %v, want both", name, got)
		}
	}
	_, sup, _ := r.lookupTemplate(ctx, "app")
	if !sup.baseOnServer || len(sup.layers) != 2 {
		t.Errorf("app's supply %+v: want its base on the server", sup)
	}
	// Bare loses to the node holding the bottom layer.
	req := Request{Template: "app", CPU: 1, MemoryMB: 256}
	if n, _, release, err := r.reserve("sb1", req, sup); err != nil || n.rec.ID != "holder" {
		t.Fatalf("reserve: %v %v", n, err)
	} else {
		release(false)
	}

	delete(src, "image-0123456789abcdef")
	if got := fetchable("app"); got["bare"] || !got["holder"] {
		t.Errorf("without the image's record: nodes able to run app %v, want holder only", got)
	}
}
