package templatedist_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestFetchRoundTrip(t *testing.T) {
	s := newServer(t, nil)
	node := nodeRegistry(t)
	f := &templatedist.Fetcher{BaseURLs: []string{s.url + "/"}, APIKey: s.key}
	got, err := f.Fetch(testCtx(t), node, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != s.tpl.Digest || got.Source != template.StreamSource {
		t.Fatalf("fetched %+v, server has digest %s", got, s.tpl.Digest)
	}
	again, err := node.Get(context.Background(), "tiny")
	if err != nil || again.Digest != s.tpl.Digest {
		t.Fatalf("not registered on the node: %+v %v", again, err)
	}
	// Recompute from disk: the registered rootfs really has the digest.
	if d, err := template.Digest(context.Background(), got.RootfsPath); err != nil || d != s.tpl.Digest {
		t.Fatalf("digest of the node's rootfs %s (%v), want %s", d, err, s.tpl.Digest)
	}
	root := got.RootfsPath
	st := func(p string) *syscall.Stat_t {
		t.Helper()
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t)
	}
	if a, b := st("etc/data"), st("etc/data-link"); a.Ino != b.Ino || a.Nlink != 2 || a.Uid != 1234 || a.Gid != 5678 || a.Mode&0o7777 != 0o640 {
		t.Errorf("hard link / owner / mode not kept: %+v %+v", a, b)
	}
	if m := st("bin/suid").Mode & 0o7777; m != 0o4755 {
		t.Errorf("setuid file mode %o", m)
	}
	if s := st("opt/private"); s.Uid != 1000 || s.Mode&0o7777 != 0o700 {
		t.Errorf("private dir uid %d mode %o", s.Uid, s.Mode&0o7777)
	}
	if s := st("run/fifo"); s.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Errorf("fifo has mode %o", s.Mode)
	}
	for link, want := range map[string]string{"bin/alias": "tool", "abs-link": "/etc/data"} {
		if got, err := os.Readlink(filepath.Join(root, link)); err != nil || got != want {
			t.Errorf("symlink %s -> %q (%v), want %q", link, got, err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/data")); err != nil || string(b) != fileContent {
		t.Errorf("content %q (%v)", b, err)
	}
	// A second fetch returns the cached template as it is.
	again, err = f.Fetch(testCtx(t), node, "tiny")
	if err != nil || again.RootfsPath != got.RootfsPath || !again.CreatedAt.Equal(got.CreatedAt) {
		t.Fatalf("second fetch: %+v %v", again, err)
	}
}

func TestFetchUnhappy(t *testing.T) {
	s := newServer(t, nil)
	cases := []struct {
		name string
		f    templatedist.Fetcher
		tpl  string
		kind error
	}{
		{"unknown template", templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}, "nope", errdefs.ErrNotFound},
		{"no key", templatedist.Fetcher{BaseURLs: []string{s.url}}, "tiny", errdefs.ErrUnauthenticated},
		{"wrong key", templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: "cube_wrong"}, "tiny", errdefs.ErrUnauthenticated},
		{"no server", templatedist.Fetcher{}, "tiny", errdefs.ErrFailedPrecondition},
		{"invalid name", templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}, "../x", errdefs.ErrInvalidArgument},
		{"server down", templatedist.Fetcher{BaseURLs: []string{deadURL(t)}, APIKey: s.key}, "tiny", errdefs.ErrUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			node := nodeRegistry(t)
			_, err := c.f.Fetch(testCtx(t), node, c.tpl)
			if !errors.Is(err, c.kind) {
				t.Fatalf("err %v, want %v", err, c.kind)
			}
			assertNothingRegistered(t, node)
		})
	}
}

// TestFetchFailover skips an unreachable replica.
func TestFetchFailover(t *testing.T) {
	s := newServer(t, nil)
	node := nodeRegistry(t)
	f := &templatedist.Fetcher{BaseURLs: []string{deadURL(t), s.url}, APIKey: s.key}
	if got, err := f.Fetch(testCtx(t), node, "tiny"); err != nil || got.Digest != s.tpl.Digest {
		t.Fatalf("fetch: %+v %v", got, err)
	}
}

// tamper returns middleware that lets edit rewrite the answers to paths
// ending in path (it gets the recorded body; headers are copied first).
func tamper(path string, edit func(body []byte, w http.ResponseWriter)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasSuffix(r.URL.Path, path) {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			edit(rec.Body.Bytes(), w)
		})
	}
}

func TestFetchRefusesTampering(t *testing.T) {
	fakeDigest := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		name string
		wrap func(http.Handler) http.Handler
		kind error
	}{
		{"content changed", tamper("/rootfs.tar", func(b []byte, w http.ResponseWriter) {
			w.Write(bytes.Replace(b, []byte(fileContent), []byte(strings.ToUpper(fileContent)), 1))
		}), errdefs.ErrConflict},
		{"wrong digest published", func(h http.Handler) http.Handler {
			// Metadata and stream header agree on a digest the content lacks.
			h = tamper("/rootfs.tar", func(b []byte, w http.ResponseWriter) {
				w.Header().Set(templatedist.DigestHeader, fakeDigest)
				w.Write(b)
			})(h)
			return tamper("/templates/tiny", func(b []byte, w http.ResponseWriter) {
				w.Write(bytes.Replace(b, []byte(`"sha256:`), []byte(`"`+fakeDigest+`","x":"`), 1))
			})(h)
		}, errdefs.ErrConflict},
		{"malformed digest", tamper("/templates/tiny", func(b []byte, w http.ResponseWriter) {
			w.Write(bytes.Replace(b, []byte(`"sha256:`), []byte(`"md5:`), 1))
		}), errdefs.ErrInvalidArgument},
		{"stream cut", tamper("/rootfs.tar", func(b []byte, w http.ResponseWriter) {
			w.WriteHeader(http.StatusOK)
			w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}), errdefs.ErrUnavailable},
		{"digest header differs", tamper("/rootfs.tar", func(b []byte, w http.ResponseWriter) {
			w.Header().Set(templatedist.DigestHeader, fakeDigest)
			w.Write(b)
		}), errdefs.ErrConflict},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newServer(t, c.wrap)
			node := nodeRegistry(t)
			f := &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
			_, err := f.Fetch(testCtx(t), node, "tiny")
			t.Logf("refused: %v", err)
			if !errors.Is(err, c.kind) {
				t.Fatalf("err %v, want %v", err, c.kind)
			}
			assertNothingRegistered(t, node)
		})
	}
}

// TestFetchConcurrent: many fetches of one template import it once (one
// download); every caller gets the same template.
func TestFetchConcurrent(t *testing.T) {
	var downloads atomic.Int32
	s := newServer(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/rootfs.tar") {
				downloads.Add(1)
				time.Sleep(200 * time.Millisecond) // keep the first import in flight
			}
			next.ServeHTTP(w, r)
		})
	})
	node := nodeRegistry(t)
	ctx := testCtx(t)
	fetchConcurrently(t, 6, s.tpl.Digest, func() (template.Template, error) {
		// Separate Fetchers: the dedup must come from the registry, as it
		// does across processes.
		f := &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
		return f.Fetch(ctx, node, "tiny")
	})
	if d := downloads.Load(); d != 1 {
		t.Fatalf("%d downloads, want 1", d)
	}
}

// TestFetchStaleLocalCopy: a node copy with another digest is not replaced
// silently.
func TestFetchStaleLocalCopy(t *testing.T) {
	s := newServer(t, nil)
	node := nodeRegistry(t)
	other := sampleRootfs(t)
	if err := os.WriteFile(filepath.Join(other, "extra"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := node.ImportDir(context.Background(), "tiny", other); err != nil {
		t.Fatal(err)
	}
	f := &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
	if _, err := f.Fetch(testCtx(t), node, "tiny"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("err %v, want ErrConflict", err)
	}
}

// deadURL is the URL of a port nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// fetchConcurrently runs fetch n times at once and fails t unless every
// call returns the template with digest want, registered at one path.
func fetchConcurrently(t *testing.T, n int, want string, fetch func() (template.Template, error)) {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]template.Template, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { results[i], errs[i] = fetch() })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || results[i].Digest != want || results[i].RootfsPath != results[0].RootfsPath {
			t.Fatalf("fetch %d: %+v %v", i, results[i], errs[i])
		}
	}
}
