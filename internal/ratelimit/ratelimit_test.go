package ratelimit

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time        { return c.t }
func (c *clock) add(d time.Duration)   { c.t = c.t.Add(d) }
func newAt(l Limit, c *clock) *Limiter { lim := New(l); lim.now = c.now; return lim }

func TestBurstThenRate(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := newAt(Limit{Rate: 2, Burst: 3}, c)
	for i := range 3 {
		if ok, _ := l.Allow("k"); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, wait := l.Allow("k")
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("past the burst: ok=%v wait=%s, want refused with 500ms", ok, wait)
	}
	if ok, _ := l.Allow("other"); !ok {
		t.Error("another key shares the bucket")
	}
	c.add(499 * time.Millisecond)
	if ok, _ := l.Allow("k"); ok {
		t.Error("token before its time")
	}
	c.add(time.Millisecond)
	if ok, _ := l.Allow("k"); !ok {
		t.Error("token not refilled after 500ms at 2/s")
	}
	c.add(time.Hour)
	for i := range 3 {
		if ok, _ := l.Allow("k"); !ok {
			t.Fatalf("refill beyond burst: request %d refused", i)
		}
	}
	if ok, _ := l.Allow("k"); ok {
		t.Error("bucket refilled beyond its burst")
	}
}

func TestUnlimitedAndValidate(t *testing.T) {
	l := New(Limit{})
	for range 1000 {
		if ok, _ := l.Allow("k"); !ok {
			t.Fatal("unlimited limiter refused")
		}
	}
	for _, bad := range []Limit{{Rate: -1, Burst: 1}, {Rate: 1, Burst: 0}, {Rate: 1, Burst: -1}} {
		if err := bad.Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Validate(%+v) = %v", bad, err)
		}
	}
	if err := (Limit{Rate: 20, Burst: 100}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int{0: 1, time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2, 5 * time.Second: 5} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%s) = %d, want %d", d, got, want)
		}
	}
}

func TestSweepBoundsKeys(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := newAt(Limit{Rate: 1, Burst: 1}, c)
	for i := range maxIdleKeys {
		l.Allow(strconv.Itoa(i))
	}
	c.add(2 * time.Second)
	l.Allow("new")
	if n := len(l.keys); n != 1 {
		t.Errorf("%d buckets after a sweep of idle keys, want 1", n)
	}
}

// A refused request takes nothing: a client hammering an empty bucket gets
// its token at the same time as one that waits, and the wait it is told
// shrinks as time passes.
func TestRefusedRequestsCostNothing(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := newAt(Limit{Rate: 4, Burst: 1}, c)
	if ok, _ := l.Allow("k"); !ok {
		t.Fatal("first request refused")
	}
	for range 10 {
		if ok, wait := l.Allow("k"); ok || wait != 250*time.Millisecond {
			t.Fatalf("empty bucket: ok=%v wait=%s, want refused with 250ms", ok, wait)
		}
	}
	c.add(100 * time.Millisecond)
	if ok, wait := l.Allow("k"); ok || wait != 150*time.Millisecond {
		t.Fatalf("100ms later: ok=%v wait=%s, want refused with 150ms", ok, wait)
	}
	c.add(150 * time.Millisecond)
	if ok, _ := l.Allow("k"); !ok {
		t.Fatal("token not there when the first refusal said it would be")
	}
}

func TestSweepKeepsBusyKeys(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := newAt(Limit{Rate: 1, Burst: 2}, c)
	l.Allow("busy")
	l.Allow("busy")
	for i := range maxIdleKeys - 1 {
		l.Allow(strconv.Itoa(i))
	}
	c.add(time.Second) // the idle keys are full again, "busy" has 1 of 2
	l.Allow("new")
	if _, ok := l.keys["busy"]; !ok || len(l.keys) != 2 {
		t.Fatalf("after the sweep: %d keys, busy kept %v; want busy and new", len(l.keys), ok)
	}
	// The kept bucket still remembers what "busy" spent.
	if ok, _ := l.Allow("busy"); !ok {
		t.Fatal("busy refused with 1 token left")
	}
	if ok, _ := l.Allow("busy"); ok {
		t.Fatal("busy got a token it did not have: its bucket was reset")
	}
}

func TestConcurrentAllowTakesExactlyBurst(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := newAt(Limit{Rate: 1, Burst: 50}, c)
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			if ok, _ := l.Allow("k"); ok {
				mu.Lock()
				allowed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if allowed != 50 {
		t.Errorf("%d requests allowed at once, want the burst of 50", allowed)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Limit
		bad  bool
	}{
		{in: "20:100", want: Limit{Rate: 20, Burst: 100}},
		{in: "0.5:1", want: Limit{Rate: 0.5, Burst: 1}},
		{in: "10", want: Limit{Rate: 10, Burst: 20}},
		{in: "0.2", want: Limit{Rate: 0.2, Burst: 1}},
		{in: "off"}, {in: "0"}, {in: "0:5"},
		{in: "fast", bad: true}, {in: "10:x", bad: true}, {in: "-1:5", bad: true},
		{in: "10:0", bad: true}, {in: "NaN:3", bad: true}, {in: "", bad: true},
	} {
		got, err := Parse(tc.in)
		if tc.bad {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Parse(%q) = %v, %v; want ErrInvalidArgument", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
		if back, err := Parse(got.String()); err != nil || back != got {
			t.Errorf("Parse(%q.String() = %q) = %v, %v", tc.in, got.String(), back, err)
		}
	}
}
