package integration

import (
	"context"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// 200 concurrent creates against `cube up` at default settings (pool,
// rate limits, capacity) all succeed: the burst queues on the node instead
// of meeting a per-key create limit (before: 103 x 201 and 97 x 429).
func TestBurstOf200AtDefaults(t *testing.T) {
	n := newNode(t)
	// A window of its own with a port per sandbox (the harness gives each
	// node 100), below the harness's 10000-19999.
	n.net.PortMin, n.net.PortMax = 9000, 9299
	// The harness turns the pool off; the default (auto) is what is tested
	// (--pool-templates stays empty: no code-interpreter build).
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(n.freePort()))
	n.extra = append(n.extra, "--pool-size", "auto", "--metrics-listen", metricsAddr)
	n.start()
	pool := func() (target, ready float64) {
		m := scrape(t, n, metricsAddr)
		return m.Value("cube_cubelet_pool_target_slots", "template", "base"), m.Value("cube_cubelet_pool_ready_slots", "template", "base")
	}
	if target, _ := pool(); target != 4 {
		t.Fatalf("idle adaptive pool: target %v slots, want the floor 4", target)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const total = 200
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	start := time.Now()
	for range total {
		wg.Go(func() {
			if _, err := n.create(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d concurrent creates at defaults: %d failed, %v", total, len(errs), time.Since(start).Round(time.Millisecond))
	if len(errs) > 0 {
		t.Fatalf("%d of %d creates failed; first: %v", len(errs), total, errs[0])
	}
	// The burst grew the pool ahead of the next one: its target is the
	// burst, bounded by the default memory budget (host memory / 16 at
	// 16 MiB a slot), and the refill makes slots past the floor.
	// Arrivals spread over more than 10 s on a loaded machine split the
	// burst: ask for half of it.
	budget := float64(max(256, hostMemoryMB()/16) / 16)
	target, _ := pool()
	if want := min(total, budget); target > want || target < want/2 {
		t.Fatalf("pool target after a burst of %d: %v, want %v (at least half)", total, target, want)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, ready := pool()
		if ready > 4 {
			t.Logf("pool grew to %v ready slots (target %v)", ready, target)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool still at %v ready slots 2 min after the burst (target %v)", ready, target)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// hostMemoryMB is MemTotal in MiB.
func hostMemoryMB() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit) >> 20
}
