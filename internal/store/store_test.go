package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/pgtest"
)

// backend is one store implementation the suite runs against. newDSN
// returns the address of a fresh, empty database.
type backend struct {
	name   string
	newDSN func(t *testing.T) string
}

var backends = []backend{
	{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "server.db") }},
	{"postgres", func(t *testing.T) string { return pgtest.Shared(t).NewDatabase(t) }},
}

// forEachBackend runs fn as one subtest per backend.
func forEachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

// openDSN opens dsn with Open and closes it when t ends.
func openDSN(t *testing.T, dsn string) Store {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// openTest opens a fresh database of backend b and returns it with its DSN.
func openTest(t *testing.T, b backend) (Store, string) {
	t.Helper()
	dsn := b.newDSN(t)
	return openDSN(t, dsn), dsn
}

// base returns the shared implementation behind s, for raw SQL in tests.
func base(s Store) *sqlStore {
	switch s := s.(type) {
	case *SQLite:
		return &s.sqlStore
	case *PostgreSQL:
		return &s.sqlStore
	}
	panic(fmt.Sprintf("unknown store %T", s))
}

// rawExec runs query (with ? placeholders) directly on s's database.
func rawExec(t *testing.T, s Store, query string, args ...any) {
	t.Helper()
	b := base(s)
	if _, err := b.db.Exec(b.d.bind(query), args...); err != nil {
		t.Fatal(err)
	}
}

// rawCount runs a SELECT COUNT(*) query directly on s's database.
func rawCount(t *testing.T, s Store, query string, args ...any) int {
	t.Helper()
	b := base(s)
	var n int
	if err := b.db.QueryRow(b.d.bind(query), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMain(m *testing.M) { pgtest.Main(m) }

func testSandbox(id string, started time.Time, meta map[string]string) Sandbox {
	return Sandbox{
		ID: id, TemplateID: "base", Metadata: meta, EnvVars: map[string]string{"A": "1"},
		StartedAt: started, EndAt: started.Add(time.Minute), State: StateRunning,
		CPUCount: 1, MemoryMB: 512, DiskSizeMB: 1024, EnvdVersion: "0.2.0", EnvdAccessToken: "tok",
	}
}

func TestOpenAppliesMigrationsAndIsIdempotent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, dsn := openTest(t, b)
		v, err := s.SchemaVersion(context.Background())
		if err != nil || v != LatestSchemaVersion {
			t.Fatalf("version = %d, %v; want %d", v, err, LatestSchemaVersion)
		}
		s.Close()
		s2, err := Open(context.Background(), dsn)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		if v, _ := s2.SchemaVersion(context.Background()); v != LatestSchemaVersion {
			t.Fatalf("version after reopen = %d", v)
		}
		s2.Close()
	})
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, dsn := openTest(t, b)
		rawExec(t, s, `UPDATE schema_version SET version = ?`, LatestSchemaVersion+1)
		s.Close()
		_, err := Open(context.Background(), dsn)
		if err == nil {
			t.Fatal("opened a database with a newer schema")
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "newer than this binary") {
			t.Fatalf("unexpected error: %v", err)
		}
	})
}

func TestOpenUnwritablePath(t *testing.T) {
	_, err := OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "missing-dir", "x.db"))
	if err == nil {
		t.Fatal("expected an error for a path in a missing directory")
	}
}

func TestOpenPostgreSQLUnreachable(t *testing.T) {
	// A port nobody listens on: closed right after it was bound.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = Open(ctx, "postgres://cube:s3cret@"+addr+"/cube?sslmode=disable&connect_timeout=2")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("unreachable server: %v, want ErrUnavailable", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error leaks the password: %v", err)
	}
	if _, err := OpenPostgreSQL(ctx, "host=127.0.0.1 port=notaport"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad dsn: %v, want ErrInvalidArgument", err)
	}
}

func TestOpenDispatch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, dsn := range []string{filepath.Join(dir, "a.db"), "sqlite://" + filepath.Join(dir, "b.db")} {
		s, err := Open(ctx, dsn)
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		if _, ok := s.(*SQLite); !ok {
			t.Fatalf("%s opened a %T", dsn, s)
		}
		s.Close()
	}
	for _, dsn := range []string{"", "sqlite://", "mysql://u@h/db", "redis://x"} {
		if _, err := Open(ctx, dsn); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Open(%q): %v, want ErrInvalidArgument", dsn, err)
		}
	}
	pgtest.Require(t)
	dsn := pgtest.Shared(t).NewDatabase(t)
	for _, d := range []string{dsn, strings.Replace(dsn, "postgres://", "postgresql://", 1)} {
		s, err := Open(ctx, d)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if _, ok := s.(*PostgreSQL); !ok {
			t.Fatalf("%s opened a %T", d, s)
		}
		s.Close()
	}
}

func TestSandboxCRUD(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := openTest(t, b)
		now := time.Now().UTC().Truncate(time.Microsecond)
		sb := testSandbox("a1", now, map[string]string{"k": "v"})
		allow := false
		sb.AllowInternetAccess = &allow
		sb.Network = []byte(`{"denyOut":["0.0.0.0/0"]}`)
		sb.Lifecycle = Lifecycle{OnTimeout: "pause", AutoResume: true}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSandbox(ctx, sb); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("duplicate create: %v", err)
		}
		got, err := s.GetSandbox(ctx, "a1")
		if err != nil {
			t.Fatal(err)
		}
		if !got.StartedAt.Equal(now) || got.Metadata["k"] != "v" || got.EnvVars["A"] != "1" ||
			got.AllowInternetAccess == nil || *got.AllowInternetAccess || string(got.Network) != `{"denyOut":["0.0.0.0/0"]}` ||
			got.Lifecycle.OnTimeout != "pause" || !got.Lifecycle.AutoResume || got.State != StateRunning {
			t.Fatalf("round trip mismatch: %+v", got)
		}
		end := now.Add(time.Hour)
		if err := s.SetState(ctx, "a1", StatePaused, end); err != nil {
			t.Fatal(err)
		}
		if err := s.SetState(ctx, "a1", "bogus", end); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("bogus state: %v", err)
		}
		if err := s.SetNetwork(ctx, "a1", nil, nil); err != nil {
			t.Fatal(err)
		}
		got, _ = s.GetSandbox(ctx, "a1")
		if got.State != StatePaused || !got.EndAt.Equal(end) || got.Network != nil || got.AllowInternetAccess != nil {
			t.Fatalf("after updates: %+v", got)
		}
		if err := s.DeleteSandbox(ctx, "a1"); err != nil {
			t.Fatal(err)
		}
		for name, err := range map[string]error{
			"get":     func() error { _, err := s.GetSandbox(ctx, "a1"); return err }(),
			"delete":  s.DeleteSandbox(ctx, "a1"),
			"setEnd":  s.SetEndAt(ctx, "a1", end),
			"setNet":  s.SetNetwork(ctx, "a1", nil, nil),
			"setStat": s.SetState(ctx, "a1", StateRunning, end),
		} {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%s after delete: %v, want ErrNotFound", name, err)
			}
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM sandbox_metadata`); n != 0 {
			t.Fatalf("metadata rows left after delete: %d", n)
		}
	})
}

func TestExpiryQueries(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := openTest(t, b)
		base := time.Unix(1_700_000_000, 0).UTC()
		for i, off := range []time.Duration{-2 * time.Second, time.Second, 3 * time.Second} {
			sb := testSandbox(fmt.Sprintf("s%d", i), base, nil)
			sb.EndAt = base.Add(off)
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		paused := testSandbox("p", base, nil)
		paused.State, paused.EndAt = StatePaused, base.Add(-time.Hour)
		s.CreateSandbox(ctx, paused)

		exp, err := s.ExpiredSandboxes(ctx, base)
		if err != nil || len(exp) != 1 || exp[0].ID != "s0" {
			t.Fatalf("expired = %v, %v", exp, err)
		}
		next, ok, err := s.NextEndAt(ctx, base)
		if err != nil || !ok || !next.Equal(base.Add(time.Second)) {
			t.Fatalf("next = %v %v %v", next, ok, err)
		}
		if _, ok, _ := s.NextEndAt(ctx, base.Add(time.Hour)); ok {
			t.Fatal("NextEndAt found something after the last end")
		}
		all, _ := s.AllSandboxes(ctx)
		if len(all) != 4 {
			t.Fatalf("all = %d", len(all))
		}
	})
}

func TestListFiltersAndPagination(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := openTest(t, b)
		base := time.Unix(1_700_000_000, 0).UTC()
		// 7 sandboxes, two share a start time to exercise the id tie-break.
		for i := 0; i < 7; i++ {
			started := base.Add(time.Duration(i) * time.Second)
			if i == 6 {
				started = base.Add(5 * time.Second)
			}
			meta := map[string]string{"team": "a", "n": fmt.Sprint(i % 2)}
			sb := testSandbox(fmt.Sprintf("id%d", i), started, meta)
			if i == 3 {
				sb.State = StatePaused
				sb.TemplateID, sb.Alias = "tpl-x", "xalias"
			}
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		ids := func(p Page) string {
			var out []string
			for _, sb := range p.Sandboxes {
				out = append(out, sb.ID)
			}
			return strings.Join(out, ",")
		}
		// Walk all pages in both orders.
		for _, tc := range []struct {
			order Order
			want  string
		}{
			{"", "id6,id5,id4,id3,id2,id1,id0"},
			{OrderAsc, "id0,id1,id2,id3,id4,id5,id6"},
		} {
			var got []string
			tok := ""
			pages := 0
			for {
				p, err := s.ListSandboxes(ctx, ListFilter{Order: tc.order, Limit: 3, NextToken: tok})
				if err != nil {
					t.Fatal(err)
				}
				pages++
				got = append(got, ids(p))
				if p.NextToken == "" {
					break
				}
				tok = p.NextToken
			}
			if strings.Join(got, ",") != tc.want || pages != 3 {
				t.Errorf("order %q: got %v in %d pages, want %s", tc.order, got, pages, tc.want)
			}
		}
		// Exactly one full page: no token.
		if p, _ := s.ListSandboxes(ctx, ListFilter{Limit: 7}); p.NextToken != "" || len(p.Sandboxes) != 7 {
			t.Errorf("exact page: %d items, token %q", len(p.Sandboxes), p.NextToken)
		}
		cases := []struct {
			name string
			f    ListFilter
			want string
		}{
			{"metadata AND", ListFilter{Metadata: map[string]string{"team": "a", "n": "1"}, Order: OrderAsc}, "id1,id3,id5"},
			{"metadata miss", ListFilter{Metadata: map[string]string{"team": "b"}}, ""},
			{"state paused", ListFilter{States: []State{StatePaused}}, "id3"},
			{"state both", ListFilter{States: []State{StatePaused, StateRunning}, Limit: 2}, "id6,id5"},
			{"started after", ListFilter{StartedAfter: base.Add(4 * time.Second), Order: OrderAsc}, "id4,id5,id6"},
			{"template id", ListFilter{Template: "tpl-x"}, "id3"},
			{"template alias", ListFilter{Template: "xalias"}, "id3"},
		}
		for _, c := range cases {
			p, err := s.ListSandboxes(ctx, c.f)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if ids(p) != c.want {
				t.Errorf("%s: got %s want %s", c.name, ids(p), c.want)
			}
		}
		for name, f := range map[string]ListFilter{
			"bad token": {NextToken: "!!!"},
			"foreign":   {NextToken: "djI6MTox"},
			"bad state": {States: []State{"dead"}},
			"bad order": {Order: "sideways"},
			"neg limit": {Limit: -1},
		} {
			if _, err := s.ListSandboxes(ctx, f); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
			}
		}
		if p, _ := s.ListSandboxes(ctx, ListFilter{Limit: MaxLimit + 5}); len(p.Sandboxes) != 7 {
			t.Errorf("huge limit: %d", len(p.Sandboxes))
		}
	})
}

func TestAPIKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := openTest(t, b)
		key, err := s.CreateKey(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^cube_[0-9a-f]{40}$`).MatchString(key) {
			t.Fatalf("key format: %q", key)
		}
		id, err := s.VerifyKey(ctx, key)
		if err != nil || id == "" {
			t.Fatalf("verify: %q %v", id, err)
		}
		for _, bad := range []string{"", "cube_nope", key + "x"} {
			if _, err := s.VerifyKey(ctx, bad); !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Errorf("verify %q: %v", bad, err)
			}
		}
		// Keys from a flag: idempotent, verify works.
		id2, err := s.AddKeyHash(ctx, "flag", "my-secret")
		if err != nil {
			t.Fatal(err)
		}
		if again, err := s.AddKeyHash(ctx, "flag", "my-secret"); err != nil || again != id2 {
			t.Fatalf("re-add: %q %v", again, err)
		}
		if _, err := s.AddKeyHash(ctx, "flag", "  "); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("empty key: %v", err)
		}
		if got, err := s.VerifyKey(ctx, "my-secret"); err != nil || got != id2 {
			t.Fatalf("verify flag key: %q %v", got, err)
		}
		// Plaintext is never stored.
		if n := rawCount(t, s, `SELECT COUNT(*) FROM api_keys WHERE hash = ? OR hash = ?`, key, "my-secret"); n != 0 {
			t.Fatal("plaintext stored")
		}
		keys, err := s.ListKeys(ctx)
		if err != nil || len(keys) != 2 || keys[0].LastUsedAt == nil {
			t.Fatalf("list: %+v %v", keys, err)
		}
		if err := s.RevokeKey(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeKey(ctx, id); err != nil {
			t.Fatalf("second revoke: %v", err)
		}
		if err := s.RevokeKey(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("revoke unknown: %v", err)
		}
		if _, err := s.VerifyKey(ctx, key); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Fatalf("revoked key verified: %v", err)
		}
		if _, err := s.AddKeyHash(ctx, "again", key); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("re-adding a revoked key: %v", err)
		}
		keys, _ = s.ListKeys(ctx)
		if keys[0].RevokedAt == nil {
			t.Fatal("revoked_at not listed")
		}
	})
}

func TestForeignKeysEnforced(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		_, err := base(s).db.Exec(`INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES ('ghost', 'k', 'v')`)
		if err == nil {
			t.Fatal("foreign keys are not enforced")
		}
		if b.name != "sqlite" {
			return
		}
		var mode string
		if err := base(s).db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			t.Fatalf("journal_mode = %q %v", mode, err)
		}
	})
}

// Verifying a recently used key reads only: before, every API request
// wrote last_used_at, so each one took SQLite's write lock and a burst of
// creates queued behind it (or, here, behind a writer holding the lock).
func TestVerifyKeyDoesNotWriteWhenRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keys.db")
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key, err := s.CreateKey(ctx, "burst")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.VerifyKey(ctx, key); err != nil { // records last_used_at
		t.Fatal(err)
	}
	other, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: holds the write lock
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET name = name`); err != nil {
		t.Fatal(err)
	}
	vctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := s.VerifyKey(vctx, key); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("VerifyKey waited %v for the write lock", d)
	}
}

func TestPlaceUnplaced(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := openTest(t, b)
		now := time.Now().UTC().Truncate(time.Microsecond)
		placed := testSandbox("placed", now, nil)
		placed.NodeID = "n1"
		for _, sb := range []Sandbox{testSandbox("old1", now, nil), testSandbox("old2", now, nil), placed} {
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		p := s.(interface {
			PlaceUnplaced(context.Context, string) (int64, error)
		})
		n, err := p.PlaceUnplaced(ctx, "local")
		if err != nil || n != 2 {
			t.Fatalf("PlaceUnplaced = %d, %v; want 2 sandboxes placed", n, err)
		}
		for id, want := range map[string]string{"old1": "local", "old2": "local", "placed": "n1"} {
			if got, _ := s.GetSandbox(ctx, id); got.NodeID != want {
				t.Errorf("sandbox %s on node %q, want %q", id, got.NodeID, want)
			}
		}
		if n, err := p.PlaceUnplaced(ctx, "local"); err != nil || n != 0 {
			t.Fatalf("second PlaceUnplaced = %d, %v; want 0", n, err)
		}
	})
}
