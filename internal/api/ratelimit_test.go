package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/ratelimit"
)

func TestRateLimitsPerKey(t *testing.T) {
	ctx := context.Background()
	st, keys := openKeyStore(t, "a", "b")
	keyA, keyB := keys[0], keys[1]
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	node := newListenNode()
	defer node.closeAll()
	m := master.New(st, node, master.Config{Domain: "cube.test", Logger: logger})
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = m.Shutdown(sctx, true)
	}()
	srv := httptest.NewServer(New(m, st, logger, WithRateLimits(RateLimits{
		All:     ratelimit.Limit{Rate: 0.5, Burst: 3},
		Creates: ratelimit.Limit{Rate: 0.001, Burst: 1},
	})))
	defer srv.Close()
	do := func(key, method, path, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res
	}
	// Creates: one per 1000 s after a burst of 1.
	if res := do(keyA, "POST", "/sandboxes", `{"templateID":"nope"}`); res.StatusCode == http.StatusTooManyRequests {
		t.Fatal("first create limited")
	}
	res := do(keyA, "POST", "/v2/sandboxes", `{"templateID":"nope"}`)
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") != "1000" {
		t.Errorf("second create: %d Retry-After %q, want 429 with 1000", res.StatusCode, res.Header.Get("Retry-After"))
	}
	// All requests: the two creates took two tokens of three.
	if res := do(keyA, "GET", "/v2/sandboxes", ""); res.StatusCode != http.StatusOK {
		t.Errorf("third request: %d, want 200", res.StatusCode)
	}
	res = do(keyA, "GET", "/v2/sandboxes", "")
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") != "2" {
		t.Errorf("fourth request: %d Retry-After %q, want 429 with 2", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if res := do(keyB, "GET", "/v2/sandboxes", ""); res.StatusCode != http.StatusOK {
		t.Errorf("another key: %d, want 200 (limits are per key)", res.StatusCode)
	}
	// Unauthenticated requests are refused before counting.
	if res := do("bad", "GET", "/v2/sandboxes", ""); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("bad key: %d, want 401", res.StatusCode)
	}
	if res := do(keyB, "GET", "/health", ""); res.StatusCode != http.StatusOK {
		t.Errorf("health: %d", res.StatusCode)
	}
}
