package cluster

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// withoutAdminHeader answers as a server older than AdminPrefix did: the
// same handler, without AdminHeader.
type withoutAdminHeader struct{ http.ResponseWriter }

func (w withoutAdminHeader) WriteHeader(code int) {
	w.ResponseWriter.Header().Del(AdminHeader)
	w.ResponseWriter.WriteHeader(code)
}

func (w withoutAdminHeader) Write(b []byte) (int, error) {
	w.ResponseWriter.Header().Del(AdminHeader)
	return w.ResponseWriter.Write(b)
}

// TestAdminUnderItsPrefixAndFallback: the admin API answers under
// /cube/v1/nodes and at /nodes; a client asks under the prefix and goes to
// /nodes only when the server does not know the prefix, never after a 404
// of the API itself (an unknown node).
func TestAdminUnderItsPrefixAndFallback(t *testing.T) {
	rs, sts := replicas(t, 1, Config{HeartbeatInterval: time.Hour})
	ctx := context.Background()
	key, err := sts[0].CreateKey(ctx, "test")
	if err != nil {
		t.Fatal(err)
	}
	admin := NewAdminHandler(rs[0], sts[0])
	var mu sync.Mutex
	var paths []string
	record := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			paths = append(paths, r.Method+" "+r.URL.Path)
			mu.Unlock()
			h.ServeHTTP(w, r)
		})
	}
	current := http.NewServeMux()
	MountAdmin(current, admin)
	older := http.NewServeMux()
	older.Handle("/nodes", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { admin.ServeHTTP(withoutAdminHeader{w}, r) }))
	older.Handle("/nodes/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { admin.ServeHTTP(withoutAdminHeader{w}, r) }))

	for _, c := range []struct {
		name      string
		mux       http.Handler
		path      string
		wantCode  int
		wantPaths []string
	}{
		{"list", current, "/nodes", 200, []string{"GET /cube/v1/nodes"}},
		{"unknown node: no fallback", current, "/nodes/nope", 404, []string{"GET /cube/v1/nodes/nope"}},
		{"older server: list", older, "/nodes", 200, []string{"GET /cube/v1/nodes", "GET /nodes"}},
		{"older server: unknown node", older, "/nodes/nope", 404, []string{"GET /cube/v1/nodes/nope", "GET /nodes/nope"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(record(c.mux))
			defer srv.Close()
			paths = nil
			res, err := SendAdmin(ctx, srv.Client(), srv.URL, key, http.MethodGet, c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != c.wantCode || !slices.Equal(paths, c.wantPaths) {
				t.Fatalf("status %d (%s), requests %v; want %d, %v", res.StatusCode, body, paths, c.wantCode, c.wantPaths)
			}
			if c.wantCode == 200 {
				var ns []NodeStatus
				if err := json.Unmarshal(body, &ns); err != nil {
					t.Fatalf("list: %v: %s", err, body)
				}
			}
		})
	}
	// A client older than the prefix still reaches the current server.
	srv := httptest.NewServer(current)
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/nodes", nil)
	req.Header.Set("X-API-Key", key)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("GET /nodes (legacy path): %s", res.Status)
	}
	if _, err := SendAdmin(ctx, srv.Client(), srv.URL, key, http.MethodGet, "/templates/x", nil); err == nil {
		t.Fatal("SendAdmin sent a path outside /nodes")
	}
}
