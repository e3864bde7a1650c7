package envd

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The lazily built Connect handlers are mounted at the paths the generated
// code serves: a renamed service would otherwise route nothing.
func TestConnectPaths(t *testing.T) {
	s := NewServer(Config{})
	if path, _ := s.process.Handler(); path != processPath {
		t.Errorf("process handler path %q, mounted at %q", path, processPath)
	}
	if path, _ := s.fs.Handler(); path != filesystemPath {
		t.Errorf("filesystem handler path %q, mounted at %q", path, filesystemPath)
	}
}

// /health and /init do not build the Connect handlers; the first call of a
// service builds its own handler only, and is served by it.
func TestConnectHandlersBuiltOnFirstCall(t *testing.T) {
	s := NewServer(Config{AccessToken: "tok"})
	serve := func(method, path, body string, token bool) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if token {
			r.Header.Set("X-Access-Token", "tok")
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	if w := serve(http.MethodGet, "/health", "", false); w.Code != http.StatusNoContent {
		t.Fatalf("/health: %d", w.Code)
	}
	if w := serve(http.MethodPost, "/init", `{"envVars":{"A":"b"}}`, true); w.Code != http.StatusNoContent {
		t.Fatalf("/init: %d %s", w.Code, w.Body)
	}
	// Refused before the handler is needed: a Connect error, nothing built.
	w := serve(http.MethodPost, processPath+"List", "{}", false)
	if w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), `"code":"unauthenticated"`) {
		t.Fatalf("List without token: %d %s", w.Code, w.Body)
	}
	if s.rpc[0].built() || s.rpc[1].built() {
		t.Fatal("Connect handlers built before any authorised RPC")
	}
	w = serve(http.MethodPost, processPath+"List", "{}", true)
	if w.Code != http.StatusOK || !strings.HasPrefix(w.Body.String(), "{") {
		t.Fatalf("List: %d %s", w.Code, w.Body)
	}
	if !s.rpc[0].built() || s.rpc[1].built() {
		t.Fatalf("after List: process built %v, filesystem built %v; want true, false", s.rpc[0].built(), s.rpc[1].built())
	}
	w = serve(http.MethodPost, processPath+"NoSuchMethod", "{}", true)
	if w.Code != http.StatusNotFound {
		t.Fatalf("unknown method: %d %s", w.Code, w.Body)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// envd listens with plain TCP, not Go's default MPTCP.
func TestListenIsPlainTCP(t *testing.T) {
	ln, err := listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rc, err := ln.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var proto int
	var serr error
	if err := rc.Control(func(fd uintptr) { proto, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	if proto != unix.IPPROTO_TCP {
		t.Fatalf("listener protocol %d, want IPPROTO_TCP (%d)", proto, unix.IPPROTO_TCP)
	}
	if _, err := listen(context.Background(), "127.0.0.1:-1"); err == nil || !strings.Contains(err.Error(), "listen on 127.0.0.1:-1") {
		t.Fatalf("bad address: %v", err)
	}
}

// startupProcs acts only with its marker, and takes both variables out of
// envd's environment.
func TestStartupProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "1")
	t.Setenv(startupProcsMarker, "")
	os.Unsetenv(startupProcsMarker)
	if startupProcs() != nil {
		t.Fatal("GOMAXPROCS without the marker is not envd's to undo")
	}
	if os.Getenv("GOMAXPROCS") != "1" {
		t.Fatal("GOMAXPROCS without the marker was removed")
	}
	for _, kv := range StartupProcsEnv {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	if startupProcs() == nil {
		t.Fatal("no restore with StartupProcsEnv")
	}
	for _, k := range []string{"GOMAXPROCS", startupProcsMarker} {
		if _, ok := os.LookupEnv(k); ok {
			t.Errorf("%s still in the environment", k)
		}
	}
}
