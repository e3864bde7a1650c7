package store

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/bench"
)

// BenchmarkBurstOfCreates is what a burst of 50 concurrent sandbox creates
// asks of the embedded store: 50 CreateSandbox transactions at once, while
// the records of the previous bursts are deleted. It reports the latency
// of one CreateSandbox (p50/p99), the figure a create's API request waits.
func BenchmarkBurstOfCreates(b *testing.B) {
	for _, burst := range []int{1, 50} {
		b.Run(fmt.Sprint(burst), func(b *testing.B) { benchmarkBurstOfCreates(b, burst) })
	}
}

func benchmarkBurstOfCreates(b *testing.B, burst int) {
	s, err := OpenSQLite(context.Background(), filepath.Join(b.TempDir(), "server.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var lat []time.Duration
	var mu sync.Mutex
	for round := 0; round < b.N; round++ {
		var wg sync.WaitGroup
		for i := range burst {
			wg.Go(func() {
				id := fmt.Sprintf("sb-%d-%d", round, i)
				start := time.Now()
				if err := s.CreateSandbox(ctx, testSandbox(id, start, map[string]string{"k": "v"})); err != nil {
					b.Error(err)
				}
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
				if round > 0 {
					if err := s.DeleteSandbox(ctx, fmt.Sprintf("sb-%d-%d", round-1, i)); err != nil {
						b.Error(err)
					}
				}
			})
		}
		wg.Wait()
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(bench.Percentile(lat, 50)), "p50-ms")
	b.ReportMetric(ms(bench.Percentile(lat, 99)), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}
