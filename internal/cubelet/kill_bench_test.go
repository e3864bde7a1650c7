package cubelet

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkKillConcurrent measures KillSandbox when N sandboxes (default
// 50, CUBE_BENCH_KILL_N) are killed at once, as `cube bench`'s concurrent
// phase does after each burst. Each iteration creates N sandboxes (4 at a
// time, outside the timing), then kills them all together. It reports the
// per-kill p50/p99, the wall time of the whole round, and the p50 of each
// teardown step the cubelet times ("sandbox release steps").
//
//	go test -c -o /tmp/cubelet.test ./internal/cubelet
//	cd internal/cubelet && /tmp/cubelet.test -test.run '^$' -test.bench KillConcurrent -test.benchtime 3x
func BenchmarkKillConcurrent(b *testing.B) {
	n := 50
	if v := os.Getenv("CUBE_BENCH_KILL_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CUBE_BENCH_KILL_N: %v", err)
		}
	}
	cfg, templates := benchNode(b)
	steps := &stepLog{next: cfg.Logger.Handler(), times: &stepTimes{ms: map[string][]float64{}}}
	cfg.Logger = slog.New(steps)
	ctx := context.Background()
	c, err := New(ctx, cfg, templates)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var lat []time.Duration
	var walls []time.Duration
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		if err := createMany(ctx, c, n); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		var mu sync.Mutex
		var wg sync.WaitGroup
		gate := make(chan struct{})
		errc := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				<-gate
				t0 := time.Now()
				err := c.KillSandbox(ctx, fmt.Sprintf("bench-%04d", i))
				d := time.Since(t0)
				if err != nil {
					errc <- err
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			})
		}
		t := time.Now()
		close(gate)
		wg.Wait()
		walls = append(walls, time.Since(t))
		close(errc)
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(percentileMS(lat, 50), "p50-ms")
	b.ReportMetric(percentileMS(lat, 99), "p99-ms")
	slices.Sort(walls)
	b.ReportMetric(percentileMS(walls, 50), "round-ms")
	for step, v := range steps.medians() {
		b.ReportMetric(v, step+"-p50-ms")
	}
}

// stepLog passes records on to next and keeps the step times of every
// "sandbox release steps" debug line, so a benchmark can report them.
type stepLog struct {
	next  slog.Handler
	times *stepTimes
}

type stepTimes struct {
	mu sync.Mutex
	ms map[string][]float64
}

func (h *stepLog) Enabled(ctx context.Context, l slog.Level) bool { return true }

func (h *stepLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "sandbox release steps" {
		h.times.mu.Lock()
		r.Attrs(func(a slog.Attr) bool {
			if d, ok := a.Value.Any().(time.Duration); ok {
				h.times.ms[a.Key] = append(h.times.ms[a.Key], float64(d.Microseconds())/1000)
			}
			return true
		})
		h.times.mu.Unlock()
	}
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *stepLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &stepLog{next: h.next.WithAttrs(as), times: h.times}
}

func (h *stepLog) WithGroup(name string) slog.Handler {
	return &stepLog{next: h.next.WithGroup(name), times: h.times}
}

func (h *stepLog) medians() map[string]float64 {
	h.times.mu.Lock()
	defer h.times.mu.Unlock()
	out := map[string]float64{}
	for k, v := range h.times.ms {
		s := slices.Clone(v)
		slices.Sort(s)
		out[k] = s[len(s)/2]
	}
	return out
}
