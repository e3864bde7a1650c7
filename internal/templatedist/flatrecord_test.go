package templatedist_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
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

// imageName is the flat template the tests below hold as a store record
// only, as a server replica records an image it imported for the others.
const imageName = "image-0123456789abcdef"

// flatRecordOnly makes the server know base's content only as the store
// record imageName (one layer: the rootfs, in the store) and mid only as
// a record whose bottom template is imageName; its registry is emptied,
// as on a replica that imported neither.
func flatRecordOnly(t *testing.T, s *layeredServer) {
	t.Helper()
	ctx := context.Background()
	var rootfs, layer bytes.Buffer
	if err := template.WriteLayerTar(ctx, s.base.RootfsPath, &rootfs); err != nil {
		t.Fatal(err)
	}
	if err := template.WriteLayerTar(ctx, s.mid.TopLayerDir(), &layer); err != nil {
		t.Fatal(err)
	}
	for digest, tarball := range map[string]*bytes.Buffer{s.base.Digest: &rootfs, s.mid.Layers[1].Digest: &layer} {
		if _, err := s.st.PutLayer(ctx, digest, tarball); err != nil {
			t.Fatal(err)
		}
	}
	recs := []store.TemplateRecord{
		{Name: imageName, Digest: s.base.Digest, Layers: []store.LayerRef{{Digest: s.base.Digest}}, CPUCount: 1, MemoryMB: 300,
			Defaults: json.RawMessage(`{"env":{"GREETING":"hi"},"workdir":"/srv"}`)},
		{Name: "mid", Digest: s.mid.Digest, BaseName: imageName, CPUCount: s.mid.CPUCount, MemoryMB: s.mid.MemoryMB,
			Layers: []store.LayerRef{{Digest: s.base.Digest}, {Digest: s.mid.Layers[1].Digest, Size: s.mid.Layers[1].Size}}},
	}
	for _, rec := range recs {
		if err := s.st.PutTemplateRecord(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"top", "mid", "base"} {
		if err := s.reg.Delete(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFlatRecordTemplate: a flat template the server holds only as a
// one-layer store record is fetchable (Source: one layer, no base),
// published with that layer, and fetched by a node holding no template at
// all from the layer alone (bytes counted, the rootfs route never asked);
// a layered record on it is fetched by a bare node as that record plus its
// top layer.
func TestFlatRecordTemplate(t *testing.T) {
	s := newLayeredServer(t, nil)
	flatRecordOnly(t, s)
	ctx := testCtx(t)

	src := templatedist.Source{Registry: s.reg, Layers: s.st}
	ref, err := src.ServerTemplate(ctx, imageName)
	want := cluster.TemplateRef{Name: imageName, Digest: s.base.Digest, CPUCount: 1, MemoryMB: 300, Layers: []string{s.base.Digest}}
	if err != nil || !reflect.DeepEqual(ref, want) {
		t.Fatalf("ServerTemplate: %+v %v, want %+v", ref, err, want)
	}
	res := get(t, s.url+templatedist.Prefix+imageName, map[string]string{"X-API-Key": s.key})
	var m templatedist.Meta
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("metadata: %d %v", res.StatusCode, err)
	}
	if m.Digest != s.base.Digest || m.BaseName != "" || !slices.Equal(digests(m.Layers), []string{s.base.Digest}) {
		t.Fatalf("metadata %+v", m)
	}

	var logs bytes.Buffer
	f := s.fetcher()
	f.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	node := nodeRegistry(t)
	s.log.reset()
	got, err := f.Fetch(ctx, node, imageName)
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, got, template.Template{Name: imageName, Digest: s.base.Digest, CPUCount: 1, MemoryMB: 300})
	if len(got.Layers) != 0 || got.Defaults == nil || got.Defaults.Env["GREETING"] != "hi" || got.Defaults.Workdir != "/srv" {
		t.Fatalf("fetched %+v (defaults %+v)", got, got.Defaults)
	}
	paths, n := s.log.snapshot()
	if wantPaths := []string{templatedist.Prefix + imageName, layerPath(s.base.Digest)}; !slices.Equal(paths, wantPaths) {
		t.Fatalf("requests %q, want %q", paths, wantPaths)
	}
	if n[layerPath(s.base.Digest)] < bigSize {
		t.Fatalf("layer download %d bytes, want the whole rootfs (> %d)", n[layerPath(s.base.Digest)], bigSize)
	}
	if line := logs.String(); !strings.Contains(line, "fetched template by layers") || !strings.Contains(line, "template="+imageName) ||
		!strings.Contains(line, "from=(nothing)") || !strings.Contains(line, "layers=1") || strings.Contains(line, "bytes=0 ") {
		t.Fatalf("log: %s", line)
	}
	assertOnly(t, node, imageName)

	// A layered record on it, onto a bare node: the image's layer, then mid's.
	node = nodeRegistry(t)
	s.log.reset()
	mid, err := f.Fetch(ctx, node, "mid")
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, mid, s.mid)
	paths, _ = s.log.snapshot()
	if !slices.Contains(paths, layerPath(s.base.Digest)) || !slices.Contains(paths, layerPath(s.mid.Layers[1].Digest)) ||
		slices.ContainsFunc(paths, func(p string) bool { return strings.HasSuffix(p, "/rootfs.tar") }) {
		t.Fatalf("requests %q", paths)
	}
	if !sameInode(t, mid.RootfsPath, node.Dir+"/"+imageName+"/rootfs", "opt/big") {
		t.Error("mid's unchanged file is not shared with the image template on the node")
	}
	assertOnly(t, node, imageName, "mid")
}

// TestFlatRecordRefused: a one-layer record whose layer is not its
// digest, and one whose layer the store lacks (then the whole rootfs is
// asked for, which a record-only template refuses), fail without
// registering anything.
func TestFlatRecordRefused(t *testing.T) {
	s := newLayeredServer(t, nil)
	flatRecordOnly(t, s)
	ctx := testCtx(t)
	other := "sha256:" + strings.Repeat("ef", 32)
	for name, rec := range map[string]store.TemplateRecord{
		"image-00000000000000aa": {Name: "image-00000000000000aa", Digest: other, Layers: []store.LayerRef{{Digest: s.base.Digest}}},
		"image-00000000000000bb": {Name: "image-00000000000000bb", Digest: other, Layers: []store.LayerRef{{Digest: other}}},
	} {
		if err := s.st.PutTemplateRecord(ctx, rec); err != nil {
			t.Fatal(err)
		}
		node := nodeRegistry(t)
		_, err := s.fetcher().Fetch(ctx, node, name)
		t.Logf("%s: %v", name, err)
		if err == nil || errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("%s: err %v, want a definite failure", name, err)
		}
		assertNothingRegistered(t, node)
	}
}
