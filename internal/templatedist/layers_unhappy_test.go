package templatedist_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
)

// onLayers returns middleware that lets edit answer every layer request
// instead of the handler (it gets the handler's recorded answer).
func onLayers(edit func(rec *httptest.ResponseRecorder, w http.ResponseWriter)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasPrefix(r.URL.Path, templatedist.LayerPrefix) {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			edit(rec, w)
		})
	}
}

// noLayers is a tamper edit that answers a template's metadata without
// its layers, as a server before layered templates did (and as an older
// node reads it).
func noLayers(b []byte, w http.ResponseWriter) {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	delete(m, "layers")
	delete(m, "baseName")
	json.NewEncoder(w).Encode(m)
}

// assertOnly checks reg holds exactly the templates named and nothing
// else but their lock files (no staging, no layer left behind).
func assertOnly(t *testing.T, reg *template.Registry, names ...string) {
	t.Helper()
	ts, err := reg.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tpl := range ts {
		got = append(got, tpl.Name)
	}
	if !slices.Equal(got, names) {
		t.Fatalf("registered %q, want %q", got, names)
	}
	ents, _ := os.ReadDir(reg.Dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".lock-") && !slices.Contains(names, e.Name()) {
			t.Fatalf("left behind in %s: %s", reg.Dir, e.Name())
		}
	}
}

// TestFetchLayersCorrupt: a layer whose content does not match its digest
// is refused with ErrConflict, and nothing is registered.
func TestFetchLayersCorrupt(t *testing.T) {
	s := newLayeredServer(t, onLayers(func(rec *httptest.ResponseRecorder, w http.ResponseWriter) {
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(bytes.Replace(rec.Body.Bytes(), []byte("from mid"), []byte("FROM MID"), 1))
	}))
	node := nodeRegistry(t)
	f := s.fetcher()
	if _, err := f.Fetch(testCtx(t), node, "base"); err != nil {
		t.Fatal(err)
	}
	_, err := f.Fetch(testCtx(t), node, "mid")
	t.Logf("refused: %v", err)
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("err %v, want ErrConflict", err)
	}
	assertOnly(t, node, "base")
	if paths, _ := s.log.snapshot(); slices.Contains(paths, templatedist.Prefix+"mid/rootfs.tar") {
		t.Fatalf("a corrupt layer fell back to the full stream: %q", paths)
	}
}

// TestFetchLayersFallback: a server that cannot serve layers (404 on
// LayerPrefix: an older version or a layer it lost), or whose metadata
// has no layers (an older version), gets the node the full stream.
func TestFetchLayersFallback(t *testing.T) {
	cases := []struct {
		name      string
		wrap      func(http.Handler) http.Handler
		wantLayer bool // a layer request was made (and answered 404)
	}{
		{"no layer routes", onLayers(func(_ *httptest.ResponseRecorder, w http.ResponseWriter) {
			http.Error(w, `{"code":404,"message":"no route"}`, http.StatusNotFound)
		}), true},
		{"no layers in metadata", tamper("/templates/mid", noLayers), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newLayeredServer(t, c.wrap)
			node := nodeRegistry(t)
			f := s.fetcher()
			if _, err := f.Fetch(testCtx(t), node, "base"); err != nil {
				t.Fatal(err)
			}
			s.log.reset()
			got, err := f.Fetch(testCtx(t), node, "mid")
			if err != nil {
				t.Fatal(err)
			}
			if got.Digest != s.mid.Digest {
				t.Fatalf("digest %s, want %s", got.Digest, s.mid.Digest)
			}
			paths, _ := s.log.snapshot()
			want := []string{templatedist.Prefix + "mid", templatedist.Prefix + "mid/rootfs.tar"}
			if c.wantLayer {
				want = slices.Insert(want, 1, layerPath(s.mid.Layers[1].Digest))
			}
			if !slices.Equal(paths, want) {
				t.Fatalf("requests %q, want %q", paths, want)
			}
			assertOnly(t, node, "base", "mid")
		})
	}
}

// recordOnly turns the server's mid into a template known only as a store
// record, as after a commit on a node in cluster mode: its top layer in
// the store, no copy in the server's registry.
func recordOnly(t *testing.T, s *layeredServer) {
	t.Helper()
	ctx := context.Background()
	var tarball bytes.Buffer
	if err := template.WriteLayerTar(ctx, s.mid.TopLayerDir(), &tarball); err != nil {
		t.Fatal(err)
	}
	top := s.mid.Layers[1]
	if _, err := s.st.PutLayer(ctx, top.Digest, &tarball); err != nil {
		t.Fatal(err)
	}
	rec := store.TemplateRecord{Name: "mid", Digest: s.mid.Digest, BaseName: "base", Node: "n1",
		CPUCount: s.mid.CPUCount, MemoryMB: s.mid.MemoryMB, DiskSizeMB: s.mid.DiskSizeMB,
		Defaults: json.RawMessage(`{"env":{"A":"1"},"workdir":"/opt"}`)}
	for _, l := range s.mid.Layers {
		rec.Layers = append(rec.Layers, store.LayerRef{Digest: l.Digest, Size: l.Size})
	}
	if err := s.st.PutTemplateRecord(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.reg.Delete(ctx, "top"); err != nil {
		t.Fatal(err)
	}
	if err := s.reg.Delete(ctx, "mid"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.reg.LayerDir(ctx, top.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("mid's layer still in the server's registry: %v", err)
	}
}

// TestRecordOnlyTemplate: a template known only as a store record is
// fetchable (Source), published with its layers, refused as a whole
// rootfs, and fetched by a node from the stored layer.
func TestRecordOnlyTemplate(t *testing.T) {
	s := newLayeredServer(t, nil)
	recordOnly(t, s)
	ctx := testCtx(t)

	src := templatedist.Source{Registry: s.reg, Layers: s.st}
	ref, err := src.ServerTemplate(ctx, "mid")
	want := cluster.TemplateRef{Name: "mid", Digest: s.mid.Digest, CPUCount: s.mid.CPUCount, MemoryMB: s.mid.MemoryMB, DiskSizeMB: s.mid.DiskSizeMB,
		Layers: digests(s.mid.Layers), Base: "base"}
	if err != nil || !reflect.DeepEqual(ref, want) {
		t.Fatalf("ServerTemplate: %+v %v, want %+v", ref, err, want)
	}
	if ref, err := src.ServerTemplate(ctx, "base"); err != nil || ref.Digest != s.base.Digest {
		t.Fatalf("ServerTemplate(base): %+v %v", ref, err)
	}
	if _, err := src.ServerTemplate(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown template: %v", err)
	}
	if _, err := (templatedist.Source{Registry: s.reg}).ServerTemplate(ctx, "mid"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("without the store: %v, want ErrNotFound", err)
	}

	auth := map[string]string{"X-API-Key": s.key}
	res := get(t, s.url+templatedist.Prefix+"mid", auth)
	var m templatedist.Meta
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("metadata: %d %v", res.StatusCode, err)
	}
	if m.Digest != s.mid.Digest || m.BaseName != "base" || !slices.Equal(digests(m.Layers), digests(s.mid.Layers)) ||
		m.Defaults == nil || m.Defaults.Workdir != "/opt" {
		t.Fatalf("metadata %+v", m)
	}
	// An older node asks for the whole rootfs: refused, saying why.
	res = get(t, s.url+templatedist.Prefix+"mid/rootfs.tar", auth)
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusConflict || !strings.Contains(string(body), "layers") || res.Header.Get(templatedist.DigestHeader) != "" {
		t.Fatalf("rootfs.tar of a record-only template: %d %s", res.StatusCode, body)
	}
	// The layer is served from the store.
	res = get(t, s.url+layerPath(s.mid.Layers[1].Digest), auth)
	if res.StatusCode != http.StatusOK || res.Header.Get(templatedist.LayerDigestHeader) != s.mid.Layers[1].Digest {
		t.Fatalf("layer: %d %v", res.StatusCode, res.Header)
	}

	for _, withBase := range []bool{true, false} {
		node := nodeRegistry(t)
		f := s.fetcher()
		if withBase {
			if _, err := f.Fetch(ctx, node, "base"); err != nil {
				t.Fatal(err)
			}
		}
		got, err := f.Fetch(ctx, node, "mid")
		if err != nil {
			t.Fatalf("with base %v: %v", withBase, err)
		}
		checkSame(t, got, s.mid)
		if got.Defaults == nil || got.Defaults.Workdir != "/opt" {
			t.Fatalf("defaults %+v", got.Defaults)
		}
		assertOnly(t, node, "base", "mid")
	}
}

// TestRecordOnlyNoBase: a record-only template whose base neither the
// node nor the server holds cannot be fetched; the error says so and
// nothing is registered.
func TestRecordOnlyNoBase(t *testing.T) {
	s := newLayeredServer(t, nil)
	recordOnly(t, s)
	if err := s.reg.Delete(context.Background(), "base"); err != nil {
		t.Fatal(err)
	}
	node := nodeRegistry(t)
	_, err := s.fetcher().Fetch(testCtx(t), node, "mid")
	t.Logf("refused: %v", err)
	if err == nil || errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("err %v, want a definite failure", err)
	}
	assertNothingRegistered(t, node)
}

func TestHandlerLayerErrors(t *testing.T) {
	s := newLayeredServer(t, nil)
	layer := layerPath(s.mid.Layers[1].Digest)
	cases := []struct {
		name, path string
		hdr        map[string]string
		want       int
	}{
		{"no key", layer, nil, http.StatusUnauthorized},
		{"wrong key", layer, map[string]string{"X-API-Key": "cube_wrong"}, http.StatusUnauthorized},
		{"malformed digest", layerPath("md5:abc"), map[string]string{"X-API-Key": s.key}, http.StatusBadRequest},
		{"unknown layer", layerPath("sha256:" + strings.Repeat("cd", 32)), map[string]string{"X-API-Key": s.key}, http.StatusNotFound},
		{"registry layer", layer, map[string]string{"Authorization": "Bearer " + s.key}, http.StatusOK},
		{"flat template's rootfs as a layer", layerPath(s.base.Digest), map[string]string{"X-API-Key": s.key}, http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := get(t, s.url+c.path, c.hdr)
			if res.StatusCode != c.want {
				t.Fatalf("status %d, want %d", res.StatusCode, c.want)
			}
			if c.want != http.StatusOK {
				if res.Header.Get(templatedist.LayerDigestHeader) != "" {
					t.Fatal("digest header on an error answer")
				}
				return
			}
			if d := strings.TrimPrefix(c.path, templatedist.LayerPrefix); res.Header.Get(templatedist.LayerDigestHeader) != d {
				t.Fatalf("digest header %q", res.Header.Get(templatedist.LayerDigestHeader))
			}
		})
	}
}

// TestSourceLayered: a layered template of the server's registry is
// reported with its layers and the name of its flat bottom template.
func TestSourceLayered(t *testing.T) {
	s := newLayeredServer(t, nil)
	ref, err := templatedist.Source{Registry: s.reg, Layers: s.st}.ServerTemplate(context.Background(), "top")
	if err != nil || !slices.Equal(ref.Layers, digests(s.top.Layers)) || ref.Base != "base" || ref.Digest != s.top.Digest {
		t.Fatalf("ServerTemplate(top): %+v %v", ref, err)
	}
	ref, err = templatedist.Source{Registry: s.reg}.ServerTemplate(context.Background(), "base")
	if err != nil || len(ref.Layers) != 0 || ref.Base != "" {
		t.Fatalf("ServerTemplate(base): %+v %v", ref, err)
	}
}
