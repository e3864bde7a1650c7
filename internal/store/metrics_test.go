package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/promtest"
)

func TestOperationNames(t *testing.T) {
	for q, want := range map[string]string{
		`SELECT ` + sandboxColumns + ` FROM sandboxes WHERE id = ?`:                                             "select_sandboxes",
		`SELECT MIN(end_at) FROM sandboxes WHERE state = $1 AND end_at > $2`:                                    "select_sandboxes",
		`select count(*) from template_build_logs where build_id = ?`:                                           "select_template_build_logs",
		"\n\t-- a comment FROM nowhere\n\tSELECT id FROM api_keys":                                              "select_api_keys",
		`SELECT s.id FROM (SELECT id FROM sandbox_metadata) x`:                                                  "select",
		`SELECT 'FROM x', id FROM nodes`:                                                                        "select_nodes",
		`SELECT pg_advisory_xact_lock(7166478662130706791)`:                                                     "select",
		`INSERT INTO sandboxes (id) VALUES (?) ON CONFLICT (id) DO NOTHING`:                                     "insert_sandboxes",
		`UPDATE template_builds SET status = ? WHERE id = ?`:                                                    "update_template_builds",
		`DELETE FROM template_build_logs WHERE build_id IN (SELECT id FROM template_builds WHERE template = ?)`: "delete_template_build_logs",
		`DELETE FROM "Weird Table"`:                                                                             "delete",
		`CREATE TABLE x (a INT)`:                                                                                "other",
		`WITH x AS (SELECT 1) SELECT * FROM x`:                                                                  "other",
		``:                                                                                                      "other",
		`UPDATE`:                                                                                                "update",
	} {
		if got := operation(q); got != want {
			t.Errorf("operation(%q) = %q, want %q", q, got, want)
		}
	}
}

// TestQueryMetrics: statements and transactions of a real store move
// cube_store_query_duration_seconds with their operation and outcome, on
// SQLite and PostgreSQL.
func TestQueryMetrics(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s, _ := openTest(t, b)
		reg := prometheus.NewRegistry()
		if err := s.RegisterMetrics(reg); err != nil {
			t.Fatal(err)
		}
		if err := s.RegisterMetrics(reg); err == nil {
			t.Error("registering twice succeeded")
		}
		const m = "cube_store_query_duration_seconds"
		now := time.Now()
		if err := s.CreateSandbox(ctx, testSandbox("sb1", now, map[string]string{"k": "v"})); err != nil {
			t.Fatal(err)
		}
		// Taken id: the transaction rolls back.
		if err := s.CreateSandbox(ctx, testSandbox("sb1", now, nil)); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("second create: %v", err)
		}
		if _, err := s.GetSandbox(ctx, "sb1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetSandbox(ctx, "missing"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("get missing: %v", err)
		}
		for range 3 {
			if _, err := s.ListSandboxes(ctx, ListFilter{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.SetEndAt(ctx, "sb1", now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		// A cancelled context fails the statement: an error.
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := s.AllSandboxes(cctx); err == nil {
			t.Fatal("AllSandboxes with a cancelled context succeeded")
		}
		f := promtest.Gather(t, reg)
		for _, c := range []struct {
			op, outcome string
			want        float64
		}{
			{"tx_insert_sandboxes", "ok", 1},
			{"tx_insert_sandboxes", "rollback", 1},
			{"select_sandboxes", "ok", 2 + 3}, // gets and listings
			{"update_sandboxes", "ok", 1},
			{"select_sandboxes", "error", 1},
		} {
			if got := f.Value(m, "operation", c.op, "outcome", c.outcome); got != c.want {
				t.Errorf("%s{operation=%q,outcome=%q} = %v, want %v", m, c.op, c.outcome, got, c.want)
			}
		}
		if h := f.Find(m, "operation", "select_sandboxes", "outcome", "ok").GetHistogram(); h.GetSampleSum() <= 0 {
			t.Errorf("select_sandboxes took no time: %v", h)
		}
		for _, fam := range f[m].GetMetric() {
			for _, lp := range fam.GetLabel() {
				if lp.GetName() == "operation" && !(identifier(lp.GetValue()) && len(lp.GetValue()) < 64) {
					t.Errorf("operation label %q", lp.GetValue())
				}
			}
		}
	})
}

// BenchmarkOperation: naming a statement (cached after its first time)
// costs ~50 ns, next to a query's tens of microseconds at best.
func BenchmarkOperation(b *testing.B) {
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes WHERE id = ?`
	b.ReportAllocs()
	for b.Loop() {
		operation(q)
	}
}

// BenchmarkGetSandboxTimed: a SQLite GetSandbox with the statement timing
// off (no registry) and on, to put its cost next to a statement's.
func BenchmarkGetSandboxTimed(b *testing.B) {
	for _, timed := range []bool{false, true} {
		name := "untimed"
		if timed {
			name = "timed"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s, err := OpenSQLite(ctx, b.TempDir()+"/server.db")
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if timed {
				if err := s.RegisterMetrics(prometheus.NewRegistry()); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.CreateSandbox(ctx, testSandbox("sb1", time.Now(), map[string]string{"k": "v"})); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.GetSandbox(ctx, "sb1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
