package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cube-dev/cube/internal/pgtest"
	"github.com/cube-dev/cube/internal/store"
)

// BenchmarkRefresh measures what a create now adds to its hot path: one
// query of the nodes table and the decoding of every record.
//
//	go test -run - -bench Refresh ./internal/cluster
func BenchmarkRefresh(b *testing.B) {
	for _, engine := range []string{"sqlite", "postgres"} {
		for _, nodes := range []int{3, 50} {
			b.Run(fmt.Sprintf("%s/%dnodes", engine, nodes), func(b *testing.B) {
				dsn := filepath.Join(b.TempDir(), "server.db")
				if engine == "postgres" {
					dsn = pgtest.Shared(b).NewDatabase(b)
				}
				st, err := store.Open(context.Background(), dsn)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { st.Close() })
				r := NewRegistry(Config{ServerVersion: "v0.5.0"}, DocumentNodes{Docs: st}, st)
				ctx := context.Background()
				for i := range nodes {
					if err := r.Register(ctx, rec(fmt.Sprintf("n%03d", i), "v0.5.0")); err != nil {
						b.Fatal(err)
					}
				}
				if err := r.Drain(ctx, "n000", Drain{Policy: DrainKill}); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for b.Loop() {
					if err := r.Refresh(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
