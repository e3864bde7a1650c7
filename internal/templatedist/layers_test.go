package templatedist_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
)

// bigSize is the size of a file of base: a download of base's rootfs is
// at least that many bytes, a download of a layer above it far less.
const bigSize = 2 << 20

// layeredServer is a server whose registry holds base (flat), mid (base
// plus a layer) and top (mid plus a layer), served by NewHandler with a
// real SQLite store, behind a recorder of the requests it answers.
type layeredServer struct {
	reg            *template.Registry
	st             store.Store
	key, url       string
	base, mid, top template.Template
	log            *requestLog
}

// requestLog records the paths a server answered and the body bytes it
// wrote per path.
type requestLog struct {
	mu    sync.Mutex
	paths []string
	bytes map[string]int64
}

func (l *requestLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.paths, l.bytes = nil, map[string]int64{}
}

func (l *requestLog) snapshot() ([]string, map[string]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := map[string]int64{}
	for k, v := range l.bytes {
		b[k] = v
	}
	return slices.Clone(l.paths), b
}

type countingWriter struct {
	http.ResponseWriter
	log  *requestLog
	path string
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.log.mu.Lock()
	w.log.bytes[w.path] += int64(n)
	w.log.mu.Unlock()
	return n, err
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// newLayeredServer builds the server; wrap (may be nil) sits in front of
// the handler, behind the request log.
func newLayeredServer(t *testing.T, wrap func(http.Handler) http.Handler) *layeredServer {
	t.Helper()
	s := serveRegistry(t, wrap)
	src := sampleRootfs(t)
	if err := os.WriteFile(filepath.Join(src, "opt/big"), []byte(strings.Repeat("b", bigSize)), 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.base, err = s.reg.ImportDir(context.Background(), "base", src); err != nil {
		t.Fatal(err)
	}
	s.mid = commit(t, s.reg, "mid", s.base, func(root string) {
		write(t, root, "opt/mid.txt", "from mid\n")
		// Replaced, never written through: it is a hard link into base.
		if err := os.Remove(filepath.Join(root, "etc/data")); err != nil {
			t.Fatal(err)
		}
		write(t, root, "etc/data", "changed by mid\n")
		if err := os.Remove(filepath.Join(root, "etc/with space")); err != nil {
			t.Fatal(err)
		}
	})
	s.top = commit(t, s.reg, "top", s.mid, func(root string) { write(t, root, "opt/top.txt", "from top\n") })
	return s
}

// serveRegistry is a layeredServer whose registry is still empty (the
// handler reads it per request: templates registered later are served).
func serveRegistry(t testing.TB, wrap func(http.Handler) http.Handler) *layeredServer {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("template import keeps owners: needs root")
	}
	dir := t.TempDir()
	st, key := serverStore(t, dir)
	s := &layeredServer{reg: &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")},
		st: st, key: key, log: &requestLog{bytes: map[string]int64{}}}
	mux := http.NewServeMux()
	templatedist.Mount(mux, templatedist.NewHandler(s.reg, st, st))
	var h http.Handler = mux
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.mu.Lock()
		s.log.paths = append(s.log.paths, r.URL.Path)
		s.log.mu.Unlock()
		h.ServeHTTP(&countingWriter{ResponseWriter: w, log: s.log, path: r.URL.Path}, r)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// commit registers name as a layered template on parent, as the cubelet's
// Commit does: a LinkTree of the parent's rootfs, changed by change.
func commit(t testing.TB, reg *template.Registry, name string, parent template.Template, change func(root string)) template.Template {
	t.Helper()
	tpl, err := reg.Register(context.Background(), name, template.Meta{Parent: &parent, CPUCount: 2, MemoryMB: 256},
		func(ctx context.Context, rootfs string) error {
			if err := template.LinkTree(ctx, parent.RootfsPath, rootfs); err != nil {
				return err
			}
			change(rootfs)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if len(tpl.Layers) != len(parent.LayerChain())+1 {
		t.Fatalf("%s: layers %+v on parent %+v", name, tpl.Layers, parent.LayerChain())
	}
	return tpl
}

func write(t testing.TB, root, rel, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, rel), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (s *layeredServer) fetcher() *templatedist.Fetcher {
	return &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
}

func layerPath(d string) string { return templatedist.LayerPrefix + d }

// checkSame fails unless got is want's template on the node: same digest
// and layers, and a rootfs whose recomputed digest is want's.
func checkSame(t *testing.T, got, want template.Template) {
	t.Helper()
	if got.Name != want.Name || got.Digest != want.Digest || !slices.Equal(digests(got.LayerChain()), digests(want.LayerChain())) {
		t.Fatalf("fetched %s %s layers %v, want %s %s layers %v", got.Name, got.Digest, digests(got.LayerChain()), want.Name, want.Digest, digests(want.LayerChain()))
	}
	if d, err := template.Digest(context.Background(), got.RootfsPath); err != nil || d != want.Digest {
		t.Fatalf("digest of the node's rootfs %s (%v), want %s", d, err, want.Digest)
	}
	if got.CPUCount != want.CPUCount || got.MemoryMB != want.MemoryMB {
		t.Fatalf("sizes %d/%d, want %d/%d", got.CPUCount, got.MemoryMB, want.CPUCount, want.MemoryMB)
	}
}

func digests(ls []template.LayerRef) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Digest)
	}
	return out
}

// sameInode reports whether rel is one file in both rootfs trees.
func sameInode(t *testing.T, a, b, rel string) bool {
	t.Helper()
	sa, err := os.Lstat(filepath.Join(a, rel))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := os.Lstat(filepath.Join(b, rel))
	if err != nil {
		t.Fatal(err)
	}
	return sa.Sys().(*syscall.Stat_t).Ino == sb.Sys().(*syscall.Stat_t).Ino
}

// TestFetchLayersTopOnly: a node holding base fetches mid by downloading
// mid's layer only; base's rootfs is not downloaded again, and mid shares
// base's unchanged files on the node.
func TestFetchLayersTopOnly(t *testing.T) {
	s := newLayeredServer(t, nil)
	node := nodeRegistry(t)
	f := s.fetcher()
	ctx := testCtx(t)
	nbase, err := f.Fetch(ctx, node, "base")
	if err != nil {
		t.Fatal(err)
	}
	s.log.reset()
	got, err := f.Fetch(ctx, node, "mid")
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, got, s.mid)
	paths, bytes := s.log.snapshot()
	top := s.mid.Layers[1].Digest
	want := []string{templatedist.Prefix + "mid", layerPath(top)}
	if !slices.Equal(paths, want) {
		t.Fatalf("requests %q, want %q", paths, want)
	}
	if n := bytes[layerPath(top)]; n == 0 || n >= bigSize {
		t.Fatalf("layer download %d bytes: want some, less than base's %d-byte file", n, bigSize)
	}
	if !sameInode(t, nbase.RootfsPath, got.RootfsPath, "opt/big") {
		t.Error("mid's unchanged file is not shared with base on the node")
	}
	if b, err := os.ReadFile(filepath.Join(got.RootfsPath, "etc/data")); err != nil || string(b) != "changed by mid\n" {
		t.Errorf("changed file %q (%v)", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(nbase.RootfsPath, "etc/data")); string(b) != fileContent {
		t.Errorf("base's file was written through: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(got.RootfsPath, "etc/with space")); !os.IsNotExist(err) {
		t.Errorf("removed file still there: %v", err)
	}
	// Registered: a second fetch asks only for the metadata.
	s.log.reset()
	if again, err := f.Fetch(ctx, node, "mid"); err != nil || again.RootfsPath != got.RootfsPath {
		t.Fatalf("second fetch: %+v %v", again, err)
	}
	if paths, _ := s.log.snapshot(); len(paths) != 1 {
		t.Fatalf("second fetch requests %q", paths)
	}
}

// TestFetchLayersWithoutBase: a node without base fetches base (whole)
// first, then mid's layer.
func TestFetchLayersWithoutBase(t *testing.T) {
	s := newLayeredServer(t, nil)
	node := nodeRegistry(t)
	got, err := s.fetcher().Fetch(testCtx(t), node, "mid")
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, got, s.mid)
	nbase, err := node.Get(context.Background(), "base")
	if err != nil {
		t.Fatalf("base not registered on the node: %v", err)
	}
	checkSame(t, nbase, s.base)
	paths, _ := s.log.snapshot()
	want := []string{templatedist.Prefix + "mid", templatedist.Prefix + "base", templatedist.Prefix + "base/rootfs.tar", layerPath(s.mid.Layers[1].Digest)}
	if !slices.Equal(paths, want) {
		t.Fatalf("requests %q, want %q", paths, want)
	}
}

// TestFetchLayersTwoDeep: a node holding mid fetches top (base, mid's
// layer, top's layer) by downloading top's layer only.
func TestFetchLayersTwoDeep(t *testing.T) {
	s := newLayeredServer(t, nil)
	node := nodeRegistry(t)
	f := s.fetcher()
	ctx := testCtx(t)
	nmid, err := f.Fetch(ctx, node, "mid")
	if err != nil {
		t.Fatal(err)
	}
	s.log.reset()
	got, err := f.Fetch(ctx, node, "top")
	if err != nil {
		t.Fatal(err)
	}
	checkSame(t, got, s.top)
	paths, _ := s.log.snapshot()
	want := []string{templatedist.Prefix + "top", layerPath(s.top.Layers[2].Digest)}
	if !slices.Equal(paths, want) {
		t.Fatalf("requests %q, want %q", paths, want)
	}
	if !sameInode(t, nmid.RootfsPath, got.RootfsPath, "opt/mid.txt") {
		t.Error("top's copy of mid's file is not shared with mid on the node")
	}
}

// TestFetchLayersConcurrent: concurrent fetches of a layered template on a
// node without its base download base once and the layer once.
func TestFetchLayersConcurrent(t *testing.T) {
	s := newLayeredServer(t, nil)
	node := nodeRegistry(t)
	ctx := testCtx(t)
	fetchConcurrently(t, 5, s.mid.Digest, func() (template.Template, error) { return s.fetcher().Fetch(ctx, node, "mid") })
	paths, _ := s.log.snapshot()
	count := map[string]int{}
	for _, p := range paths {
		count[p]++
	}
	if c := count[templatedist.Prefix+"base/rootfs.tar"]; c != 1 {
		t.Errorf("base downloaded %d times, want 1 (%q)", c, paths)
	}
	if c := count[layerPath(s.mid.Layers[1].Digest)]; c != 1 {
		t.Errorf("layer downloaded %d times, want 1 (%q)", c, paths)
	}
}
