package cubelet

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/bench"
	"github.com/cube-dev/cube/internal/template"
)

// BenchmarkCreate measures CreateSandbox on each path of the create
// pipeline: cold (no pool), from a plain slot and from a pre-started slot.
// The pool is refilled, and each sandbox killed, outside the timing;
// p50-ms and p90-ms are per create.
//
//	go test -run '^$' -bench 'Create$' -benchtime 40x ./internal/cubelet
func BenchmarkCreate(b *testing.B) {
	for _, tc := range []struct {
		name     string
		pool     int
		prestart bool
	}{{"cold", 0, false}, {"plain-slot", 2, false}, {"prestarted", 2, true}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg, templates := benchNode(b)
			cfg.PoolSize, cfg.PoolPrestart, cfg.PoolTemplate = tc.pool, tc.prestart, "tiny"
			benchCreates(b, cfg, templates, 30*time.Second, nil)
		})
	}
}

// benchCreates runs b.N creates of the pool template on a cubelet made
// from cfg, each after the pool is back to cfg.PoolSize slots (waiting up
// to poolWait) and killed after, both outside the timing; check, when set,
// looks at each sandbox before its kill. It reports p50-ms and p90-ms.
func benchCreates(b *testing.B, cfg Config, templates *template.Registry, poolWait time.Duration, check func(c *Cubelet, id string)) {
	ctx := context.Background()
	c, err := New(ctx, cfg, templates)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		c.stopPool()
		c.DrainPool(ctx)
		c.Close()
	}()
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for deadline := time.Now().Add(poolWait); c.PoolSize() < cfg.PoolSize; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("pool has %d slots, want %d", c.PoolSize(), cfg.PoolSize)
			}
		}
		id := fmt.Sprintf("bench-%04d", i)
		b.StartTimer()
		start := time.Now()
		if _, err := c.CreateSandbox(ctx, createReq(id)); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		if check != nil {
			check(c, id)
		}
		if err := c.KillSandbox(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	slices.Sort(lat)
	b.ReportMetric(percentileMS(lat, 50), "p50-ms")
	b.ReportMetric(percentileMS(lat, 90), "p90-ms")
}

// percentileMS is the p-th percentile of sorted in milliseconds, by the
// nearest-rank method `cube bench` uses (bench.Percentile).
func percentileMS(sorted []time.Duration, p float64) float64 {
	return float64(bench.Percentile(sorted, p).Microseconds()) / 1000
}
