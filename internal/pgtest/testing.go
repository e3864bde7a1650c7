package pgtest

import (
	"context"
	"os"
	"sync"
	"testing"
)

// Require skips t (or fails it when $CI is set) if PostgreSQL is not
// installed.
func Require(t testing.TB) {
	t.Helper()
	if _, err := BinDir(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set and PostgreSQL is required: %v", err)
		}
		t.Skipf("skipping PostgreSQL test: %v", err)
	}
}

// New starts a server for t and stops it when t ends.
func New(t testing.TB) *Server {
	t.Helper()
	Require(t)
	s, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("pgtest: stop: %v", err)
		}
	})
	return s
}

var shared struct {
	mu  sync.Mutex
	srv *Server
	err error
}

// Shared returns one server for the whole test binary, started on first
// use. The package's TestMain must call Main so it is stopped at the end.
func Shared(t testing.TB) *Server {
	t.Helper()
	Require(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = Start(context.Background())
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.srv
}

// Main runs the tests and stops the shared server; call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	shared.mu.Lock()
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil && code == 0 {
			os.Stderr.WriteString("pgtest: stop shared server: " + err.Error() + "\n")
			code = 1
		}
	}
	shared.mu.Unlock()
	os.Exit(code)
}

// NewDatabase creates a fresh database on s for t and returns its DSN.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	dsn, err := s.CreateDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}
