package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/promtest"
)

func testDigest(c string) string { return "sha256:" + strings.Repeat(c, 64) }

// failingReader yields n bytes of data, then fails.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// concurrentPuts runs put n times at once and counts the calls that
// stored (first complete write wins: exactly one should).
func concurrentPuts(t *testing.T, n int, put func() (bool, error)) int {
	t.Helper()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		stored int
	)
	for range n {
		wg.Go(func() {
			ok, err := put()
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				stored++
			}
		})
	}
	wg.Wait()
	return stored
}

func readLayer(t *testing.T, s Store, digest string) ([]byte, int64) {
	t.Helper()
	r, size, err := s.OpenLayer(context.Background(), digest)
	if err != nil {
		t.Fatalf("open layer %s: %v", digest, err)
	}
	defer r.Close()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read layer %s: %v", digest, err)
	}
	return got, size
}

// A multi-MiB layer round-trips with its size; of concurrent puts of one
// digest exactly one stores it and the others' chunks are gone; a later
// put of the digest returns stored=false, reads its reader to the end and
// leaves the first bytes; a bad digest is refused.
func TestLayerPutOpen(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		d := testDigest("a")
		data := make([]byte, 3*ChunkSize+17)
		rand.Read(data)

		if ok, err := s.HasLayer(ctx, d); ok || err != nil {
			t.Fatalf("has missing layer: %v %v", ok, err)
		}
		if _, _, err := s.OpenLayer(ctx, d); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("open missing layer: %v", err)
		}
		if _, err := s.PutLayer(ctx, "sha256:nothex", bytes.NewReader(data)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("bad digest: %v", err)
		}

		stored := concurrentPuts(t, 4, func() (bool, error) { return s.PutLayer(ctx, d, bytes.NewReader(data)) })
		if stored != 1 {
			t.Fatalf("%d writers stored the layer; want 1", stored)
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM layer_chunks`); n != 4 {
			t.Fatalf("%d chunks stored; want the 4 of one write (losers' removed)", n)
		}

		other := bytes.NewReader([]byte("other bytes"))
		if ok, err := s.PutLayer(ctx, d, other); ok || err != nil {
			t.Fatalf("second put: %v %v", ok, err)
		}
		if other.Len() != 0 {
			t.Fatalf("second put left %d bytes of its reader unread", other.Len())
		}
		if ok, err := s.HasLayer(ctx, d); !ok || err != nil {
			t.Fatalf("has layer: %v %v", ok, err)
		}
		got, size := readLayer(t, s, d)
		if size != int64(len(data)) || !bytes.Equal(got, data) {
			t.Fatalf("read back %d bytes, size %d (want %d)", len(got), size, len(data))
		}
		// Template files and layers are apart: the same key is two blobs.
		if ok, _ := s.HasLayer(ctx, strings.Repeat("a", 64)); ok {
			t.Fatal("a layer appeared under a template file's key")
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM template_file_chunks`); n != 0 {
			t.Fatalf("layer chunks landed in template_file_chunks: %d", n)
		}

		empty := testDigest("e")
		if ok, err := s.PutLayer(ctx, empty, bytes.NewReader(nil)); !ok || err != nil {
			t.Fatalf("empty layer: %v %v", ok, err)
		}
		if got, size := readLayer(t, s, empty); len(got) != 0 || size != 0 {
			t.Fatalf("empty layer read %d bytes, size %d", len(got), size)
		}
	})
}

// A put whose reader fails half way leaves nothing visible and no chunks;
// a later put of the digest succeeds.
func TestLayerPutFailureLeavesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		d := testDigest("b")
		data := make([]byte, 2*ChunkSize+ChunkSize/2)
		rand.Read(data)
		boom := errors.New("node went away")
		ok, err := s.PutLayer(ctx, d, &failingReader{data: data[:len(data)/2], err: boom})
		if ok || !errors.Is(err, boom) {
			t.Fatalf("failed put: %v %v", ok, err)
		}
		if ok, err := s.HasLayer(ctx, d); ok || err != nil {
			t.Fatalf("has half-written layer: %v %v", ok, err)
		}
		if _, _, err := s.OpenLayer(ctx, d); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("open half-written layer: %v", err)
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM layer_chunks`); n != 0 {
			t.Fatalf("%d chunks of the failed put kept", n)
		}
		// A cancelled context: nothing either.
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if ok, err := s.PutLayer(cctx, d, bytes.NewReader(data)); ok || err == nil {
			t.Fatalf("put with a cancelled context: %v %v", ok, err)
		}
		if ok, _ := s.HasLayer(ctx, d); ok {
			t.Fatal("layer visible after a cancelled put")
		}
		if ok, err := s.PutLayer(ctx, d, bytes.NewReader(data)); !ok || err != nil {
			t.Fatalf("put after the failures: %v %v", ok, err)
		}
		if got, _ := readLayer(t, s, d); !bytes.Equal(got, data) {
			t.Fatal("layer read back differs")
		}
	})
}

// Records are inserted, replaced (layers too), read, listed by name and
// deleted; missing ones are ErrNotFound; bad ones are refused.
func TestTemplateRecords(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		if _, err := s.GetTemplateRecord(ctx, "web"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}
		if err := s.DeleteTemplateRecord(ctx, "web"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("delete missing: %v", err)
		}
		if got, err := s.ListTemplateRecords(ctx); err != nil || got == nil || len(got) != 0 {
			t.Fatalf("empty list: %#v %v", got, err)
		}
		for _, bad := range []TemplateRecord{
			{Digest: testDigest("1")},
			{Name: "x"},
			{Name: "x", Digest: testDigest("1"), Layers: []LayerRef{{}}},
			{Name: "x", Digest: testDigest("1"), Defaults: json.RawMessage(`{`)},
		} {
			if err := s.PutTemplateRecord(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("put %+v: %v", bad, err)
			}
		}

		created := time.Unix(1700000000, 123).UTC()
		web := TemplateRecord{
			Name: "web", Digest: testDigest("9"),
			Layers:   []LayerRef{{Digest: testDigest("1")}, {Digest: testDigest("2"), Size: 4096}},
			BaseName: "base", CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 4096,
			Defaults: json.RawMessage(`{"envs":{"A":"1"},"cwd":"/app"}`),
			Node:     "node-1", CreatedAt: created,
		}
		if err := s.PutTemplateRecord(ctx, web); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTemplateRecord(ctx, "web")
		if err != nil || !reflect.DeepEqual(got, web) {
			t.Fatalf("get:\n got %+v %v\nwant %+v", got, err, web)
		}
		// A record without layers or defaults, and a zero CreatedAt.
		if err := s.PutTemplateRecord(ctx, TemplateRecord{Name: "api", Digest: testDigest("8")}); err != nil {
			t.Fatal(err)
		}
		api, err := s.GetTemplateRecord(ctx, "api")
		if err != nil || api.Layers != nil || api.Defaults != nil || time.Since(api.CreatedAt) > time.Minute {
			t.Fatalf("api: %+v %v", api, err)
		}
		// Replacing web: new digest, a shorter stack, no defaults.
		web2 := web
		web2.Digest, web2.Layers, web2.Defaults, web2.Node = testDigest("7"), []LayerRef{{Digest: testDigest("3"), Size: 1}}, nil, "node-2"
		if err := s.PutTemplateRecord(ctx, web2); err != nil {
			t.Fatal(err)
		}
		list, err := s.ListTemplateRecords(ctx)
		if err != nil || len(list) != 2 || list[0].Name != "api" || !reflect.DeepEqual(list[1], web2) {
			t.Fatalf("list: %+v %v", list, err)
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM template_record_layers WHERE template = ?`, "web"); n != 1 {
			t.Fatalf("%d layer rows of web after replace; want 1", n)
		}
		if err := s.DeleteTemplateRecord(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetTemplateRecord(ctx, "web"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("get deleted: %v", err)
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM template_record_layers WHERE template = ?`, "web"); n != 0 {
			t.Fatalf("%d layer rows of a deleted record kept", n)
		}
		if list, _ := s.ListTemplateRecords(ctx); len(list) != 1 || list[0].Name != "api" {
			t.Fatalf("list after delete: %+v", list)
		}
	})
}

// DeleteUnusedLayers removes old layers no record references, and old
// chunks of writes cut short; it keeps referenced layers, recent layers, a
// layer whose repeated put or record put marked it used, and the chunks of
// a write in progress.
func TestDeleteUnusedLayers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		put := func(c string) string {
			d := testDigest(c)
			if ok, err := s.PutLayer(ctx, d, bytes.NewReader(bytes.Repeat([]byte(c), ChunkSize+1))); !ok || err != nil {
				t.Fatalf("put %s: %v %v", c, ok, err)
			}
			return d
		}
		referenced, unused, recent, reput, rerecorded := put("1"), put("2"), put("3"), put("4"), put("5")
		if err := s.PutTemplateRecord(ctx, TemplateRecord{Name: "web", Digest: testDigest("9"),
			Layers: []LayerRef{{Digest: testDigest("0")}, {Digest: referenced}}}); err != nil {
			t.Fatal(err)
		}
		old := toNanos(time.Now().Add(-2 * time.Hour))
		rawExec(t, s, `UPDATE layers SET created_at = ?, used_at = ? WHERE digest <> ?`, old, old, recent)
		rawExec(t, s, `UPDATE layer_chunks SET created_at = ?`, old)
		// Marked used now: a repeated put, a record naming the layer.
		if ok, err := s.PutLayer(ctx, reput, strings.NewReader("x")); ok || err != nil {
			t.Fatalf("re-put: %v %v", ok, err)
		}
		if err := s.PutTemplateRecord(ctx, TemplateRecord{Name: "api", Digest: testDigest("8"), Layers: []LayerRef{{Digest: rerecorded}}}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTemplateRecord(ctx, "api"); err != nil {
			t.Fatal(err)
		}
		// Writes cut short: one long ago, one in progress (its first chunk
		// is old, its last recent).
		rawExec(t, s, `INSERT INTO layer_chunks (upload_id, seq, data, created_at) VALUES (?, ?, ?, ?)`, "orphan", 0, []byte("x"), old)
		rawExec(t, s, `INSERT INTO layer_chunks (upload_id, seq, data, created_at) VALUES (?, ?, ?, ?)`, "in-progress", 0, []byte("x"), old)
		rawExec(t, s, `INSERT INTO layer_chunks (upload_id, seq, data, created_at) VALUES (?, ?, ?, ?)`, "in-progress", 1, []byte("x"), toNanos(time.Now()))

		gone, err := s.DeleteUnusedLayers(ctx, time.Now().Add(-time.Hour))
		if err != nil || !reflect.DeepEqual(gone, []string{unused}) {
			t.Fatalf("collected %v %v; want [%s]", gone, err, unused)
		}
		for _, d := range []string{referenced, recent, reput, rerecorded} {
			if ok, err := s.HasLayer(ctx, d); !ok || err != nil {
				t.Errorf("layer %s collected: %v", d, err)
			} else if got, _ := readLayer(t, s, d); len(got) != ChunkSize+1 {
				t.Errorf("layer %s damaged: %d bytes", d, len(got))
			}
		}
		if ok, _ := s.HasLayer(ctx, unused); ok {
			t.Fatal("unused layer kept")
		}
		for upload, want := range map[string]int{"orphan": 0, "in-progress": 2} {
			if n := rawCount(t, s, `SELECT COUNT(*) FROM layer_chunks WHERE upload_id = ?`, upload); n != want {
				t.Errorf("%d chunks of %s; want %d", n, upload, want)
			}
		}
		// 4 kept layers of 2 chunks each, and the write in progress.
		if n := rawCount(t, s, `SELECT COUNT(*) FROM layer_chunks`); n != 4*2+2 {
			t.Errorf("%d chunks left; want 10 (the unused layer's removed)", n)
		}
		// Once the record is gone its layer goes too, when old enough.
		if err := s.DeleteTemplateRecord(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		if gone, err := s.DeleteUnusedLayers(ctx, time.Now().Add(-time.Hour)); err != nil || !reflect.DeepEqual(gone, []string{referenced}) {
			t.Fatalf("after the record's delete: %v %v", gone, err)
		}
	})
}

// A database at schema version 7 keeps its builds, tags and template files
// through migration 8, which adds working layers and records.
func TestMigrationToLayers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		dsn := b.newDSN(t)
		all := migrations
		migrations = all[:7]
		old, err := Open(context.Background(), dsn)
		migrations = all
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		file := make([]byte, ChunkSize+5)
		rand.Read(file)
		hash := strings.Repeat("f", 64)
		err = errors.Join(
			old.CreateTemplateBuild(ctx, TemplateBuild{ID: "b1", Template: "web", Status: BuildWaiting}),
			func() error { _, err := old.PutTemplateTags(ctx, "web", []string{"v1"}, "b1", "web"); return err }(),
			func() error { _, err := old.PutTemplateFile(ctx, hash, bytes.NewReader(file)); return err }(),
		)
		if v, verr := old.SchemaVersion(ctx); verr != nil || v != 7 {
			err = errors.Join(err, fmt.Errorf("old schema version %d, %v", v, verr))
		}
		old.Close()
		if err != nil {
			t.Fatal(err)
		}

		s := openDSN(t, dsn)
		if v, err := s.SchemaVersion(ctx); err != nil || v != LatestSchemaVersion || v != 8 {
			t.Fatalf("schema version %d, %v; want 8", v, err)
		}
		if bd, err := s.GetTemplateBuild(ctx, "b1"); err != nil || bd.Template != "web" {
			t.Fatalf("build after migration: %+v %v", bd, err)
		}
		if tag, err := s.GetTemplateTag(ctx, "web", "v1"); err != nil || tag.BuildID != "b1" {
			t.Fatalf("tag after migration: %+v %v", tag, err)
		}
		r, err := s.OpenTemplateFile(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, file) {
			t.Fatalf("template file after migration: %d bytes, %v", len(got), err)
		}
		if ok, err := s.PutLayer(ctx, testDigest("a"), strings.NewReader("layer")); !ok || err != nil {
			t.Fatalf("put layer after migration: %v %v", ok, err)
		}
		if err := s.PutTemplateRecord(ctx, TemplateRecord{Name: "web", Digest: testDigest("b"), Layers: []LayerRef{{Digest: testDigest("a")}}}); err != nil {
			t.Fatal(err)
		}
	})
}

// The layer and record statements are timed like every other one.
func TestLayerQueryMetrics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := openTest(t, b)
		reg := prometheus.NewRegistry()
		if err := s.RegisterMetrics(reg); err != nil {
			t.Fatal(err)
		}
		d := testDigest("a")
		if _, err := s.PutLayer(ctx, d, bytes.NewReader(make([]byte, 2*ChunkSize))); err != nil {
			t.Fatal(err)
		}
		readLayer(t, s, d)
		if err := s.PutTemplateRecord(ctx, TemplateRecord{Name: "web", Digest: testDigest("b"), Layers: []LayerRef{{Digest: d}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ListTemplateRecords(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.DeleteUnusedLayers(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		const m = "cube_store_query_duration_seconds"
		f := promtest.Gather(t, reg)
		for _, c := range []struct {
			op   string
			want float64
		}{
			{"insert_layer_chunks", 2},
			{"insert_layers", 1},
			{"select_layer_chunks", 2},
			{"tx_insert_template_records", 1},
			{"select_template_records", 1},
			{"delete_layer_chunks", 1}, // the orphan sweep
		} {
			if got := f.Value(m, "operation", c.op, "outcome", "ok"); got != c.want {
				t.Errorf("%s{operation=%q,outcome=\"ok\"} = %v, want %v", m, c.op, got, c.want)
			}
		}
	})
}
