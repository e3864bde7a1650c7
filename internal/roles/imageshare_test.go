package roles

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/imagetest"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
	"github.com/cube-dev/cube/internal/templatedist"
)

// Two server replicas share one store: replica A imports an image and
// stores it as one layer plus a record; replica B reuses it without
// pulling the image again (no blob read from the registry), the build
// service on B sees it with the image's defaults, a node fetching it from
// B (whose registry lacks it) gets the same template, and deleting it
// through B removes the record although no node holds it. A record whose
// layer is gone makes B import the image itself.
func TestImageTemplatesSharedByReplicas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an image import keeps file owners")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img := smallImage(t, "etc/app.conf", "v1")
	registry := imagetest.NewRegistry(t)
	host := registry.Host
	ref := registry.Push(t, "team/app:1", img)
	// blobs counts reads of the image's layer (a resolve reads the
	// manifest and the config only).
	layerDigest := imagetest.LayerDigest(t, img)
	blobs := func() int { return registry.BlobReads(layerDigest) }
	digest, _ := img.Digest()
	tpl := templatebuild.ImageTemplate(digest.String())

	if blobs() != 0 {
		t.Fatal("layer read while pushing")
	}
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	replica := func(name string) (*template.Registry, *registryImages) {
		reg := &template.Registry{Dir: filepath.Join(dir, name, "templates"), CacheDir: filepath.Join(dir, name, "cache")}
		m, err := newRegistryImages(reg, []string{host})
		if err != nil {
			t.Fatal(err)
		}
		m.shared, m.log = st, slog.New(slog.NewTextHandler(io.Discard, nil))
		return reg, m
	}
	regA, a := replica("a")
	regB, b := replica("b")

	var progress bytes.Buffer
	if got, err := a.Import(ctx, ref, nil, &progress); err != nil || got != tpl || blobs() != 1 {
		t.Fatalf("import on A: %q %v (layer read %d times)", got, err, blobs())
	}
	if !strings.Contains(progress.String(), "storing template "+tpl+" for the other server replicas") {
		t.Errorf("A's progress:\n%s", progress.String())
	}
	onA, err := regA.Get(ctx, tpl)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.GetTemplateRecord(ctx, tpl)
	if err != nil || rec.Digest != onA.Digest || len(rec.Layers) != 1 || rec.Layers[0].Digest != onA.Digest || rec.BaseName != "" ||
		!strings.Contains(string(rec.Defaults), `"/srv"`) {
		t.Fatalf("record %+v %v (template digest %s)", rec, err, onA.Digest)
	}
	if has, err := st.HasLayer(ctx, onA.Digest); err != nil || !has {
		t.Fatalf("layer stored: %v %v", has, err)
	}

	pulled := blobs()
	progress.Reset()
	if got, err := b.Import(ctx, ref, nil, &progress); err != nil || got != tpl {
		t.Fatalf("import on B: %q %v", got, err)
	}
	if n := blobs() - pulled; n != 0 || !strings.Contains(progress.String(), "already imported as template "+tpl+" (by another server replica)") {
		t.Fatalf("B read %d blobs; progress:\n%s", n, progress.String())
	}
	if _, err := regB.Get(ctx, tpl); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("B's registry: %v", err)
	}

	// The build service on B finds it, with the image's defaults.
	creg := cluster.NewRegistry(cluster.Config{ServerVersion: "v0.5.0", Layers: st}, cluster.DocumentNodes{Docs: st}, st)
	tpls := clusterTemplates{server: templatebuild.RegistryTemplates{Registry: regB}, records: st, reg: creg}
	info, err := tpls.Get(ctx, tpl)
	if err != nil || info.Digest != onA.Digest || info.Workdir != "/srv" || info.Env["GREETING"] != "hi" || info.CreatedAt.IsZero() {
		t.Fatalf("Get on B: %+v %v", info, err)
	}
	list, err := tpls.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != tpl {
		t.Fatalf("List on B: %+v %v", list, err)
	}

	// A node fetches it from B: from the stored layer.
	keyB, err := st.CreateKey(ctx, "node")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	templatedist.Mount(mux, templatedist.NewHandler(regB, st, st))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	node := &template.Registry{Dir: filepath.Join(dir, "node", "templates"), CacheDir: filepath.Join(dir, "node", "cache")}
	got, err := (&templatedist.Fetcher{BaseURLs: []string{hs.URL}, APIKey: keyB}).Fetch(ctx, node, tpl)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != onA.Digest || got.Defaults == nil || got.Defaults.Workdir != "/srv" {
		t.Fatalf("fetched %+v", got)
	}
	if b, err := os.ReadFile(filepath.Join(got.RootfsPath, "etc/app.conf")); err != nil || string(b) != "v1" {
		t.Fatalf("fetched file %q %v", b, err)
	}

	// Deleting through B (no node holds it) removes the record.
	if err := tpls.Delete(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetTemplateRecord(ctx, tpl); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("record after delete: %v", err)
	}
	if _, err := tpls.Get(ctx, tpl); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
	// A record without its layer: B imports the image itself, and records it again.
	if err := st.PutTemplateRecord(ctx, store.TemplateRecord{Name: tpl, Digest: "sha256:" + strings.Repeat("ab", 32),
		Layers: []store.LayerRef{{Digest: "sha256:" + strings.Repeat("ab", 32)}}}); err != nil {
		t.Fatal(err)
	}
	pulled = blobs()
	if got, err := b.Import(ctx, ref, nil, io.Discard); err != nil || got != tpl || blobs() == pulled {
		t.Fatalf("import on B without the layer: %q %v (blobs %d)", got, err, blobs()-pulled)
	}
	if rec, err := st.GetTemplateRecord(ctx, tpl); err != nil || rec.Digest != onA.Digest {
		t.Fatalf("record after B's import: %+v %v", rec, err)
	}
	// A record of that name that is no image (several layers) is a conflict.
	if err := regB.Delete(ctx, tpl); err != nil {
		t.Fatal(err)
	}
	if err := st.PutTemplateRecord(ctx, store.TemplateRecord{Name: tpl, Digest: onA.Digest,
		Layers: []store.LayerRef{{Digest: onA.Digest}, {Digest: onA.Digest}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Import(ctx, ref, nil, io.Discard); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("import over a layered record: %v", err)
	}
}
