package bench

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Summary is the latency distribution of one measured operation.
type Summary struct {
	N      int     `json:"n"`
	Errors int     `json:"errors"`
	P50Ms  float64 `json:"p50Ms"`
	P95Ms  float64 `json:"p95Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
	MeanMs float64 `json:"meanMs"`
	// FirstError is the first failure seen, to say why Errors is not zero.
	FirstError string `json:"firstError,omitempty"`
}

// Summarize computes a Summary of successful samples d plus errs failures.
// Percentiles use the nearest-rank method on the sorted samples.
func Summarize(d []time.Duration, errs int, firstErr string) Summary {
	s := Summary{N: len(d), Errors: errs, FirstError: firstErr}
	if len(d) == 0 {
		return s
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	var sum time.Duration
	for _, v := range sorted {
		sum += v
	}
	s.P50Ms = ms(Percentile(sorted, 50))
	s.P95Ms = ms(Percentile(sorted, 95))
	s.P99Ms = ms(Percentile(sorted, 99))
	s.MaxMs = ms(sorted[len(sorted)-1])
	s.MeanMs = ms(sum / time.Duration(len(sorted)))
	return s
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest sample such that at least p% of the
// samples are less than or equal to it. sorted must be ascending; an empty
// slice yields 0.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// ms converts d to milliseconds rounded to 0.01 ms.
func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*100) / 100
}

// Ratio is a/b rounded to 0.01, or 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return math.Round(a/b*100) / 100
}

// Samples collects durations and failures from concurrent workers.
type Samples struct {
	mu       sync.Mutex
	D        []time.Duration
	Errs     int
	FirstErr string
}

// Add records one outcome.
func (s *Samples) Add(d time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.Errs == 0 {
			s.FirstErr = err.Error()
		}
		s.Errs++
		return
	}
	s.D = append(s.D, d)
}

// Summary summarizes the collected outcomes.
func (s *Samples) Summary() Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Summarize(s.D, s.Errs, s.FirstErr)
}

// round2 rounds f to two decimals.
func round2(f float64) float64 { return math.Round(f*100) / 100 }
