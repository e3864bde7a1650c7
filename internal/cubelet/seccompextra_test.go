package cubelet

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// A template's extra syscalls (cube template create --allow-syscall) reach
// the filter of its sandboxes, cold and pre-started; other templates keep
// the default filter. Both are compiled by the cubelet and handed down.
func TestTemplateExtraSyscallsReachSpec(t *testing.T) {
	needRoot(t)
	n := newTestNode(t)
	ctx := context.Background()
	if _, err := n.templates.ImportDir(ctx, "extra", busyboxRootfs(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.templates.UpdateDefaults(ctx, "extra", func(d *template.Defaults) { d.Syscalls = []string{"kcmp"} }); err != nil {
		t.Fatal(err)
	}
	n.cfg.PoolSize = 1
	n.cfg.PoolTemplates = []PoolTarget{{Template: "extra", Size: 1}}
	c := n.start(t)
	waitPool(t, c, 2)

	spec := func(id string) *nsrt.Seccomp {
		t.Helper()
		rec, err := c.store.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(c.sandboxDir(rec.Runtime()), nsrt.SpecFile))
		if err != nil {
			t.Fatal(err)
		}
		var s nsrt.Spec
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		return s.Seccomp
	}
	for _, id := range []string{"extra-prestarted", "extra-cold"} {
		req := createReq(id)
		req.Template = "extra"
		if _, err := c.CreateSandbox(ctx, req); err != nil {
			t.Fatal(err)
		}
		if s := spec(id); s == nil || !slices.Equal(s.Allow, []string{"kcmp"}) || s.Log || len(s.Filters) != 1 {
			t.Errorf("%s: seccomp spec %+v, want allow [kcmp] and its compiled filter", id, s)
		}
	}
	if _, err := c.CreateSandbox(ctx, createReq("plain")); err != nil {
		t.Fatal(err)
	}
	plain := spec("plain")
	if plain == nil || len(plain.Allow) != 0 || len(plain.Filters) != 1 {
		t.Fatalf("sandbox of a template without extras: seccomp spec %+v, want the default filter", plain)
	}
	if extra := spec("extra-cold"); extra.Filters[0].Code == plain.Filters[0].Code {
		t.Error("the filter with kcmp allowed is the default filter")
	}
}
