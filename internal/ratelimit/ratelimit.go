// Package ratelimit applies a token-bucket limit per key (an API key id):
// each key has its own golang.org/x/time/rate bucket that refills at Rate
// tokens per second up to Burst, and every request takes one token. It adds
// to x/time/rate what the API needs: a bucket per key with a bound on idle
// keys, the wait to put in Retry-After, and the flag syntax.
package ratelimit

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Limit is a sustained rate and a burst. A zero Rate means unlimited.
type Limit struct {
	Rate  float64 // tokens per second
	Burst int     // bucket size; at least 1 when Rate > 0
}

// Validate rejects negative values and a positive rate without burst.
func (l Limit) Validate() error {
	if l.Rate < 0 || l.Burst < 0 || math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) {
		return fmt.Errorf("rate limit %s: negative or not finite: %w", l, errdefs.ErrInvalidArgument)
	}
	if l.Rate > 0 && l.Burst < 1 {
		return fmt.Errorf("rate limit %s: burst must be at least 1: %w", l, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Unlimited reports whether l lets everything through.
func (l Limit) Unlimited() bool { return l.Rate == 0 }

// maxIdleKeys bounds the map: past it, buckets that have refilled (their
// key was idle long enough to be indistinguishable from a new one) are
// dropped.
const maxIdleKeys = 4096

// Limiter holds one bucket per key. It is safe for concurrent use.
type Limiter struct {
	limit Limit
	// now is the clock; tests replace it, since rate.Limiter takes the time
	// of every call explicitly.
	now  func() time.Time
	mu   sync.Mutex // guards keys and the buckets' use
	keys map[string]*rate.Limiter
}

// New returns a limiter applying l to every key; l must be valid.
func New(l Limit) *Limiter {
	return &Limiter{limit: l, now: time.Now, keys: map[string]*rate.Limiter{}}
}

// Allow takes a token from key's bucket. When the bucket is empty it takes
// nothing and returns false with the time until a token is available.
func (l *Limiter) Allow(key string) (bool, time.Duration) {
	if l.limit.Unlimited() {
		return true, 0
	}
	now := l.now()
	// One lock over lookup and take, as a sweep may drop a full bucket
	// between them and the next request would find a fresh one.
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(key, now)
	// AllowN changes nothing when it refuses, so a refused request does not
	// push the next token further away.
	if b.AllowN(now, 1) {
		return true, 0
	}
	missing := 1 - b.TokensAt(now)
	return false, time.Duration(missing / l.limit.Rate * float64(time.Second))
}

// bucket returns key's bucket, made full on first use. l.mu is held.
func (l *Limiter) bucket(key string, now time.Time) *rate.Limiter {
	b, ok := l.keys[key]
	if !ok {
		if len(l.keys) >= maxIdleKeys {
			l.sweep(now)
		}
		b = rate.NewLimiter(rate.Limit(l.limit.Rate), l.limit.Burst)
		l.keys[key] = b
	}
	return b
}

// sweep drops full buckets: a new one would behave the same.
func (l *Limiter) sweep(now time.Time) {
	for k, b := range l.keys {
		if b.TokensAt(now) >= float64(l.limit.Burst) {
			delete(l.keys, k)
		}
	}
}

// RetryAfterSeconds renders a wait as the integer seconds of a Retry-After
// header: rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// Parse reads a limit written "RATE:BURST" (tokens per second, bucket size),
// "RATE" (burst = max(1, 2*RATE)) or "0" / "off" (unlimited), as command-line
// flags take it.
func Parse(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "0" || s == "off" || s == "unlimited" {
		return Limit{}, nil
	}
	rateStr, burstStr, hasBurst := strings.Cut(s, ":")
	rate, err := strconv.ParseFloat(rateStr, 64)
	if err != nil {
		return Limit{}, fmt.Errorf("rate limit %q: want RATE[:BURST] or off: %w", s, errdefs.ErrInvalidArgument)
	}
	l := Limit{Rate: rate, Burst: max(1, int(math.Ceil(2*rate)))}
	if hasBurst {
		if l.Burst, err = strconv.Atoi(burstStr); err != nil {
			return Limit{}, fmt.Errorf("rate limit %q: burst %q is not an integer: %w", s, burstStr, errdefs.ErrInvalidArgument)
		}
	}
	if rate == 0 {
		return Limit{}, nil
	}
	if err := l.Validate(); err != nil {
		return Limit{}, err
	}
	return l, nil
}

// String writes l the way Parse reads it.
func (l Limit) String() string {
	if l.Unlimited() {
		return "off"
	}
	return strconv.FormatFloat(l.Rate, 'f', -1, 64) + ":" + strconv.Itoa(l.Burst)
}
