package template

import (
	"errors"
	"slices"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// UpdateDefaults changes template.json only: the digest stays, other
// defaults stay, Get sees the change.
func TestUpdateDefaults(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	tpl, err := r.ImportDir(ctx, "small", writeTree(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.UpdateDefaults(ctx, "small", func(d *Defaults) { d.Workdir = "/srv" }); err != nil {
		t.Fatal(err)
	}
	got, err := r.UpdateDefaults(ctx, "small", func(d *Defaults) { d.Syscalls = []string{"kcmp"} })
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.Get(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []Template{got, again} {
		if x.Digest != tpl.Digest || x.Defaults == nil || x.Defaults.Workdir != "/srv" || !slices.Equal(x.Defaults.Syscalls, []string{"kcmp"}) ||
			x.RootfsPath != tpl.RootfsPath {
			t.Errorf("after UpdateDefaults: %+v (defaults %+v), want digest %s", x, x.Defaults, tpl.Digest)
		}
	}
	if _, err := r.UpdateDefaults(ctx, "nosuch", func(*Defaults) {}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown template: %v", err)
	}
}
