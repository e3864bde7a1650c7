package templatedist_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
)

const fileContent = "hello distribution\n"

// server is a server-side registry holding template "tiny", served by
// templatedist.Handler behind a real SQLite key store.
type server struct {
	reg  *template.Registry
	tpl  template.Template
	key  string
	keys store.Store
	url  string
	srv  *httptest.Server
}

// newServer registers "tiny" from a rootfs with every kind of entry the
// registry keeps and serves it; wrap (may be nil) sits in front of the
// handler, e.g. to tamper with responses.
func newServer(t *testing.T, wrap func(http.Handler) http.Handler) *server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("template import keeps owners: needs root")
	}
	dir := t.TempDir()
	st, key := serverStore(t, dir)
	reg := &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
	tpl, err := reg.ImportDir(context.Background(), "tiny", sampleRootfs(t))
	if err != nil {
		t.Fatal(err)
	}
	// Mounted as the server mounts it: beside a catch-all that stands for
	// the E2B API (answering 418 with its path).
	mux := http.NewServeMux()
	templatedist.Mount(mux, templatedist.Handler(reg, st))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, r.Method+" "+r.URL.Path)
	})
	var h http.Handler = mux
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &server{reg: reg, tpl: tpl, key: key, keys: st, url: srv.URL, srv: srv}
}

// serverStore opens a control-plane store in dir holding one API key (the
// key is returned), closed when the test ends.
func serverStore(t testing.TB, dir string) (store.Store, string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, err := st.CreateKey(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	return st, key
}

// nodeRegistry is an empty registry in a temp dir, as on a fresh node.
func nodeRegistry(t testing.TB) *template.Registry {
	t.Helper()
	dir := t.TempDir()
	return &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
}

// sampleRootfs makes a small tree with directories of several modes,
// owners, a setuid file, relative and absolute symlinks, a hard link, a
// FIFO and a name with a space.
func sampleRootfs(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "rootfs")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin", "etc", "opt/private", "var/empty", "run"} {
		must(os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	must(os.WriteFile(filepath.Join(root, "bin/tool"), []byte("#!/bin/sh\necho tool\n"), 0o755))
	must(os.WriteFile(filepath.Join(root, "bin/suid"), []byte("suid"), 0o755))
	must(os.Chmod(filepath.Join(root, "bin/suid"), 0o755|os.ModeSetuid))
	must(os.WriteFile(filepath.Join(root, "etc/data"), []byte(fileContent), 0o640))
	must(os.Chown(filepath.Join(root, "etc/data"), 1234, 5678))
	must(os.Link(filepath.Join(root, "etc/data"), filepath.Join(root, "etc/data-link")))
	must(os.Symlink("tool", filepath.Join(root, "bin/alias")))
	must(os.Symlink("/etc/data", filepath.Join(root, "abs-link")))
	must(os.Lchown(filepath.Join(root, "abs-link"), 1000, 1000))
	must(os.WriteFile(filepath.Join(root, "etc/with space"), nil, 0o600))
	must(syscall.Mkfifo(filepath.Join(root, "run/fifo"), 0o600))
	must(os.Chmod(filepath.Join(root, "run/fifo"), 0o620))
	must(os.Chown(filepath.Join(root, "opt/private"), 1000, 1000))
	must(os.Chmod(filepath.Join(root, "opt/private"), 0o700))
	must(os.Chmod(filepath.Join(root, "var/empty"), 0o750))
	return root
}

// assertNothingRegistered checks reg holds no template and no staging left.
func assertNothingRegistered(t *testing.T, reg *template.Registry) {
	t.Helper()
	ts, err := reg.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 0 {
		t.Fatalf("templates registered after a failed fetch: %+v", ts)
	}
	ents, _ := os.ReadDir(reg.Dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".lock-") {
			t.Fatalf("left behind in %s: %s", reg.Dir, e.Name())
		}
	}
}
