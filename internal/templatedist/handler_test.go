package templatedist_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/templatedist"
)

func get(t *testing.T, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

func TestHandlerMetadata(t *testing.T) {
	s := newServer(t, nil)
	res := get(t, s.url+"/templates/tiny", map[string]string{"X-API-Key": s.key})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	var got map[string]any
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"name": "tiny", "digest": s.tpl.Digest, "cpuCount": float64(s.tpl.CPUCount),
		"memoryMB": float64(s.tpl.MemoryMB), "diskSizeMB": float64(s.tpl.DiskSizeMB)}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestHandlerRootfsStream(t *testing.T) {
	s := newServer(t, nil)
	res := get(t, s.url+"/templates/tiny/rootfs.tar", map[string]string{"Authorization": "Bearer " + s.key})
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	if d := res.Header.Get(templatedist.DigestHeader); d != s.tpl.Digest {
		t.Fatalf("digest header %q, want %q", d, s.tpl.Digest)
	}
	if cl := res.ContentLength; cl != -1 {
		t.Errorf("Content-Length %d: the stream should be chunked, not buffered", cl)
	}
	tr := tar.NewReader(res.Body)
	var names []string
	byName := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		byName[h.Name] = h
	}
	if !sort.StringsAreSorted(names[1:]) || names[0] != "./" {
		t.Errorf("entries not in lexical order: %q", names)
	}
	checks := []struct {
		name string
		typ  byte
		mode int64
		uid  int
		link string
	}{
		{"./bin/suid", tar.TypeReg, 0o4755, 0, ""},
		{"./etc/data", tar.TypeReg, 0o640, 1234, ""},
		{"./etc/data-link", tar.TypeLink, 0o640, 1234, "./etc/data"},
		{"./bin/alias", tar.TypeSymlink, 0o777, 0, "tool"},
		{"./abs-link", tar.TypeSymlink, 0o777, 1000, "/etc/data"},
		{"./run/fifo", tar.TypeFifo, 0o620, 0, ""},
		{"./opt/private/", tar.TypeDir, 0o700, 1000, ""},
		{"./tmp/", tar.TypeDir, 0o1777, 0, ""},
	}
	for _, c := range checks {
		h, ok := byName[c.name]
		if !ok {
			t.Errorf("%s missing from the stream", c.name)
			continue
		}
		if h.Typeflag != c.typ || h.Mode&0o7777 != c.mode || h.Uid != c.uid || h.Linkname != c.link {
			t.Errorf("%s: type %c mode %o uid %d link %q; want %c %o %d %q", c.name, h.Typeflag, h.Mode, h.Uid, h.Linkname, c.typ, c.mode, c.uid, c.link)
		}
	}
}

func TestHandlerErrors(t *testing.T) {
	s := newServer(t, nil)
	cases := []struct {
		name, path string
		hdr        map[string]string
		want       int
	}{
		{"no key", "/templates/tiny", nil, http.StatusUnauthorized},
		{"no key on the stream", "/templates/tiny/rootfs.tar", nil, http.StatusUnauthorized},
		{"wrong key", "/templates/tiny", map[string]string{"X-API-Key": "cube_wrong"}, http.StatusUnauthorized},
		{"wrong bearer", "/templates/tiny/rootfs.tar", map[string]string{"Authorization": "Bearer nope"}, http.StatusUnauthorized},
		{"unknown template", "/templates/nope", map[string]string{"X-API-Key": s.key}, http.StatusNotFound},
		{"unknown template stream", "/templates/nope/rootfs.tar", map[string]string{"X-API-Key": s.key}, http.StatusNotFound},
		{"invalid name", "/templates/BAD..NAME", map[string]string{"X-API-Key": s.key}, http.StatusBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := get(t, s.url+c.path, c.hdr)
			if res.StatusCode != c.want {
				t.Fatalf("status %d, want %d", res.StatusCode, c.want)
			}
			if res.Header.Get(templatedist.DigestHeader) != "" {
				t.Fatal("digest header on an error answer")
			}
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.NewDecoder(res.Body).Decode(&body); err != nil || body.Code != c.want || body.Message == "" {
				t.Fatalf("error body %+v (%v)", body, err)
			}
		})
	}
	// A revoked key stops working.
	keys, err := s.keys.ListKeys(context.Background())
	if err != nil || len(keys) == 0 {
		t.Fatalf("list keys: %v", err)
	}
	for _, k := range keys {
		if err := s.keys.RevokeKey(context.Background(), k.ID); err != nil {
			t.Fatal(err)
		}
	}
	if res := get(t, s.url+"/templates/tiny", map[string]string{"X-API-Key": s.key}); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("revoked key: status %d", res.StatusCode)
	}
}

func TestSource(t *testing.T) {
	s := newServer(t, nil)
	var src cluster.TemplateSource = templatedist.Source{Registry: s.reg}
	ref, err := src.ServerTemplate(context.Background(), "tiny")
	if err != nil {
		t.Fatal(err)
	}
	want := cluster.TemplateRef{Name: "tiny", Digest: s.tpl.Digest, CPUCount: s.tpl.CPUCount, MemoryMB: s.tpl.MemoryMB, DiskSizeMB: s.tpl.DiskSizeMB}
	if !reflect.DeepEqual(ref, want) {
		t.Fatalf("ref %+v, want %+v", ref, want)
	}
	if _, err := src.ServerTemplate(context.Background(), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown template: %v, want ErrNotFound", err)
	}
	// A server without any templates directory knows no template.
	empty := templatedist.Source{Registry: nodeRegistry(t)}
	if _, err := empty.ServerTemplate(context.Background(), "tiny"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("empty registry: %v, want ErrNotFound", err)
	}
}

// TestMountLeavesE2BRoutes: the server answers nodes under Prefix and, for
// nodes of the previous version, on the two legacy GET routes; every other
// /templates path (the E2B template API: list, builds, files, aliases,
// delete) reaches the API handler, and GET /templates is not redirected
// to /templates/ (it was while the whole /templates/ subtree was mounted).
func TestMountLeavesE2BRoutes(t *testing.T) {
	s := newServer(t, nil)
	auth := map[string]string{"X-API-Key": s.key}
	for _, path := range []string{templatedist.Prefix + "tiny", templatedist.Prefix + "tiny/rootfs.tar", "/templates/tiny", "/templates/tiny/rootfs.tar"} {
		if res := get(t, s.url+path, auth); res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, res.StatusCode)
		}
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/templates"},
		{http.MethodGet, "/templates/tiny/files/" + strings.Repeat("a", 64)},
		{http.MethodGet, "/templates/aliases/tiny"},
		{http.MethodGet, "/templates/tiny/builds/b1/status"},
		{http.MethodDelete, "/templates/tiny"},
		{http.MethodPost, "/v3/templates"},
	} {
		req, _ := http.NewRequest(c.method, s.url+c.path, nil)
		req.Header.Set("X-API-Key", s.key)
		res, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusTeapot || string(body) != c.method+" "+c.path {
			t.Errorf("%s %s: %d %q, want the API handler's answer", c.method, c.path, res.StatusCode, body)
		}
	}
}

// TestFetchFromPreviousServer: a server of the previous version serves
// templates under /templates/ only (404 under Prefix); a node fetches from
// it all the same.
func TestFetchFromPreviousServer(t *testing.T) {
	s := newServer(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, templatedist.Prefix) {
				http.Error(w, `{"code":404,"message":"no route"}`, http.StatusNotFound)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	f := &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
	got, err := f.Fetch(context.Background(), nodeRegistry(t), "tiny")
	if err != nil || got.Digest != s.tpl.Digest {
		t.Fatalf("fetch from a previous-version server: %+v, %v", got, err)
	}
	if _, err := f.Fetch(context.Background(), nodeRegistry(t), "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown template from a previous-version server: %v", err)
	}
}
