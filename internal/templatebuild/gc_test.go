package templatebuild

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
)

// The collector removes step-cache and image templates older than the age
// that no sandbox uses, and uploads unused for as long; it keeps users'
// templates, young leftovers, leftovers in use, uploads just linked, and
// does nothing while a build runs.
func TestCollectLeftovers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: template registration keeps owners")
	}
	ctx := context.Background()
	f := newFixture(t, nil)
	reg := func(name string) {
		t.Helper()
		if _, err := f.reg.Register(ctx, name, template.Meta{Source: "test"}, func(ctx context.Context, rootfs string) error {
			return os.WriteFile(filepath.Join(rootfs, "x"), nil, 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	oldCache, usedImage, oldImage := CachePrefix+strings.Repeat("a", 24), ImageTemplate("sha256:used"), ImageTemplate("sha256:old")
	for _, n := range []string{oldCache, usedImage, oldImage, "app"} {
		reg(n)
	}
	now := time.Now()
	if err := f.st.CreateSandbox(ctx, store.Sandbox{ID: "sbx-img", TemplateID: usedImage, StartedAt: now, EndAt: now.Add(time.Hour),
		State: store.StateRunning, EnvdVersion: "0.2.0"}); err != nil {
		t.Fatal(err)
	}
	tar := makeTar(t, false, entry{name: "f", typ: '0', body: "x"})
	oldFile, linkedFile, newFile := strings.Repeat("1", 64), strings.Repeat("2", 64), strings.Repeat("3", 64)
	for _, h := range []string{oldFile, linkedFile, newFile} {
		if err := f.svc.files.put(ctx, h, bytes.NewReader(tar)); err != nil {
			t.Fatal(err)
		}
	}
	// Two uploads were last used a week ago (the store's clock is real:
	// set their rows directly).
	db, err := sql.Open("sqlite", filepath.Join(f.dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	weekAgo := now.Add(-8 * 24 * time.Hour)
	if _, err := db.Exec(`UPDATE template_files SET used_at = ? WHERE hash IN (?, ?)`, weekAgo.UnixNano(), oldFile, linkedFile); err != nil {
		t.Fatal(err)
	}
	// A layer whose template record is gone, and one still recorded.
	orphan, kept := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	for _, d := range []string{orphan, kept} {
		if _, err := f.st.PutLayer(ctx, d, strings.NewReader("layer "+d)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.st.PutTemplateRecord(ctx, store.TemplateRecord{Name: "app", Digest: "sha256:" + strings.Repeat("c", 64),
		Layers: []store.LayerRef{{Digest: "sha256:" + strings.Repeat("d", 64)}, {Digest: kept}}, BaseName: "base"}); err != nil {
		t.Fatal(err)
	}
	// Linking a present file marks it used.
	if l, err := f.svc.FileLink(ctx, "base", linkedFile, "http://x"); err != nil || !l.Present {
		t.Fatalf("link %+v %v", l, err)
	}

	// Templates are a minute old: an hour's age collects none of them, and
	// of the week-old uploads only the one not linked since.
	c, err := f.svc.CollectLeftovers(ctx, time.Hour)
	if err != nil || len(c.Templates) != 0 || !slices.Equal(c.Files, []string{oldFile}) || len(c.Layers) != 0 {
		t.Fatalf("hour: %+v %v", c, err)
	}
	// A month later, with a week's age: the unused leftovers go.
	f.svc.now = func() time.Time { return now.Add(30 * 24 * time.Hour) }
	c, err = f.svc.CollectLeftovers(ctx, 7*24*time.Hour)
	slices.Sort(c.Templates)
	want := []string{oldCache, oldImage}
	slices.Sort(want)
	if err != nil || !slices.Equal(c.Templates, want) || !slices.Equal(c.Layers, []string{orphan}) {
		t.Fatalf("month: %+v %v", c, err)
	}
	if has, err := f.st.HasLayer(ctx, kept); err != nil || !has {
		t.Fatalf("the recorded layer was collected: %v %v", has, err)
	}
	for _, n := range []string{usedImage, "app", "base"} {
		if _, err := f.reg.Get(ctx, n); err != nil {
			t.Errorf("%s removed: %v", n, err)
		}
	}
	for _, n := range want {
		if _, err := f.reg.Get(ctx, n); err == nil {
			t.Errorf("%s kept", n)
		}
	}
	// A month later every upload is unused for longer than a week.
	slices.Sort(c.Files)
	if !slices.Equal(c.Files, []string{linkedFile, newFile}) {
		t.Errorf("month: files %v", c.Files)
	}
	// While a build runs, nothing is collected.
	reg(oldCache)
	f.svc.gcMu.RLock()
	c, err = f.svc.CollectLeftovers(ctx, 7*24*time.Hour)
	f.svc.gcMu.RUnlock()
	if err != nil || !c.Skipped || len(c.Templates) != 0 {
		t.Fatalf("during a build: %+v %v", c, err)
	}
	if _, err := f.reg.Get(ctx, oldCache); err != nil {
		t.Error("collected during a build")
	}
}
