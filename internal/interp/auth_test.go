package interp

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/envd"
)

// withEnvd starts a real envd (its HTTP routes) with token and a server
// that asks it.
func withEnvd(t *testing.T, token string) (*testServer, *httptest.Server) {
	t.Helper()
	e := httptest.NewServer(envd.NewServer(envd.Config{AccessToken: token, EnvVars: map[string]string{"GLOBAL": "g"}}))
	t.Cleanup(e.Close)
	return startServer(t, Config{EnvdURL: e.URL}), e
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// A sandbox with a token: /execute needs it (missing or wrong: 401 like
// envd's, and nothing runs, no context is made); the /contexts routes
// refuse a wrong one and take none (the official client sends none there);
// /health needs nothing.
func TestAccessTokenRequired(t *testing.T) {
	s, _ := withEnvd(t, "tok")
	ctx := ctxT(t)
	for name, hdr := range map[string]map[string]string{"missing": nil, "wrong": {"X-Access-Token": "nope"}, "empty": {"X-Access-Token": ""}} {
		status, b := s.do(ctx, "POST", "/execute", map[string]any{"code": "open('/tmp/ran', 'w')"}, hdr)
		if status != http.StatusUnauthorized || !strings.Contains(string(b), "X-Access-Token") {
			t.Errorf("%s token: POST /execute = %d %s, want 401 naming X-Access-Token", name, status, b)
		}
	}
	// Even a request for an unknown context gets 401, not 404.
	if status, b := s.do(ctx, "POST", "/execute", map[string]any{"code": "1", "context_id": "nosuch"}, nil); status != http.StatusUnauthorized {
		t.Errorf("unknown context without token: %d %s, want 401", status, b)
	}
	if n := len(s.it.Contexts()); n != 0 {
		t.Errorf("refused executions made %d contexts", n)
	}

	wrong := map[string]string{"X-Access-Token": "nope"}
	if status, b := s.do(ctx, "POST", "/contexts", map[string]any{"language": "python"}, wrong); status != http.StatusUnauthorized {
		t.Errorf("POST /contexts wrong token: %d %s", status, b)
	}
	status, b := s.do(ctx, "POST", "/contexts", map[string]any{"language": "python"}, nil)
	if status != http.StatusOK {
		t.Fatalf("POST /contexts without a token (as the client sends it): %d %s", status, b)
	}
	id := s.it.Contexts()[0].ID
	for _, rt := range []struct{ method, path string }{
		{"GET", "/contexts"}, {"POST", "/contexts/" + id + "/restart"}, {"DELETE", "/contexts/" + id},
	} {
		if status, b := s.do(ctx, rt.method, rt.path, nil, wrong); status != http.StatusUnauthorized {
			t.Errorf("%s %s wrong token: %d %s, want 401", rt.method, rt.path, status, b)
		}
	}
	if _, err := s.it.Context(id); err != nil {
		t.Errorf("a refused DELETE removed the context: %v", err)
	}
	if status, _ := s.do(ctx, "GET", "/contexts", nil, map[string]string{"X-Access-Token": "tok"}); status != http.StatusOK {
		t.Errorf("GET /contexts right token: %d", status)
	}
	if status, _ := s.do(ctx, "GET", "/health", nil, nil); status != http.StatusOK {
		t.Errorf("GET /health without a token: %d", status)
	}

	// The right token runs code (s.run sends "tok"), with envd's env vars.
	if ex := s.code("import os\nos.environ.get('GLOBAL')"); ex.text() != "g" {
		t.Errorf("with the token: %v", ex.lines)
	}
}

// The token is envd's, asked per request: a new token set by envd's
// /init (as on resume) applies at once and the old one stops working.
func TestAccessTokenFollowsEnvdInit(t *testing.T) {
	s, e := withEnvd(t, "old")
	ctx := ctxT(t)
	req, err := http.NewRequestWithContext(ctx, "POST", e.URL+"/init", bytes.NewReader([]byte(`{"accessToken":"new"}`)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Access-Token", "old")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("envd /init: %s", resp.Status)
	}
	if status, b := s.do(ctx, "POST", "/execute", map[string]any{"code": "1"}, map[string]string{"X-Access-Token": "old"}); status != http.StatusUnauthorized {
		t.Errorf("old token after /init: %d %s, want 401", status, b)
	}
	if status, b := s.do(ctx, "POST", "/execute", map[string]any{"code": "1"}, map[string]string{"X-Access-Token": "new"}); status != http.StatusOK {
		t.Errorf("new token after /init: %d %s", status, b)
	}
}

// A sandbox without a token takes every caller, as its envd does.
func TestNoAccessToken(t *testing.T) {
	s, _ := withEnvd(t, "")
	ctx := ctxT(t)
	for _, hdr := range []map[string]string{nil, {"X-Access-Token": "anything"}} {
		status, b := s.do(ctx, "POST", "/execute", map[string]any{"code": "6 * 7"}, hdr)
		if status != http.StatusOK {
			t.Fatalf("POST /execute %v: %d %s", hdr, status, b)
		}
		if ex := parseStream(t, b); ex.text() != "42" {
			t.Errorf("POST /execute %v: %v", hdr, ex.lines)
		}
	}
}

// When envd cannot be asked, nothing runs (fail closed): 503, and the
// code did not run.
func TestAccessTokenEnvdDown(t *testing.T) {
	e := httptest.NewServer(http.NotFoundHandler())
	url := e.URL
	e.Close()
	s := startServer(t, Config{EnvdURL: url})
	ran := filepath.Join(t.TempDir(), "ran")
	status, b := s.do(ctxT(t), "POST", "/execute", map[string]any{"code": "open(" + strconv.Quote(ran) + ", 'w').close()"}, map[string]string{"X-Access-Token": "tok"})
	if status != http.StatusServiceUnavailable || !strings.Contains(string(b), "envd") {
		t.Errorf("envd down: %d %s, want 503 naming envd", status, b)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the code ran although the token could not be checked")
	}
}

// The official client sends X-Access-Token on runCode (POST /execute) and
// on none of its /contexts calls: what TestAccessTokenRequired assumes. If
// a newer client sends it there too, those routes can require it.
func TestClientSendsTokenOnExecuteOnly(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "test", "e2e", "node_modules", "@e2b", "code-interpreter", "dist", "index.mjs"))
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the client's bundle (npm ci in test/e2e): %v", err)
		}
		t.Skipf("the client's bundle (npm ci in test/e2e): %v", err)
	}
	src := string(b)
	for method, want := range map[string]bool{
		"runCode": true, "createCodeContext": false, "removeCodeContext": false,
		"listCodeContexts": false, "restartCodeContext": false,
	} {
		i := strings.Index(src, "\tasync "+method+"(")
		if i < 0 {
			t.Errorf("no method %s in the client", method)
			continue
		}
		body := src[i+1:]
		if j := strings.Index(body, "\n\tasync "); j >= 0 {
			body = body[:j]
		}
		if got := strings.Contains(body, `headers["X-Access-Token"]`); got != want {
			t.Errorf("%s sends X-Access-Token: %t, want %t", method, got, want)
		}
	}
}
