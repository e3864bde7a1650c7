package bench

import (
	"context"
	"sync"
	"time"
)

// CreateResult is the outcome of a create/kill latency run.
type CreateResult struct {
	Concurrency int     `json:"concurrency"`
	Create      Summary `json:"create"`
	Kill        Summary `json:"kill"`
	WallSec     float64 `json:"wallSec"`
	// PerSec is successful creates per second of create time (kills excluded).
	PerSec float64 `json:"createsPerSec"`
}

// RunSerial creates and kills n sandboxes one at a time, timing each
// create (until 201) and each kill (until 204).
func RunSerial(ctx context.Context, c *Client, n int) CreateResult {
	var create, kill Samples
	start := time.Now()
	busy := serialCreates(ctx, c, n, &create, &kill)
	r := finish(1, &create, &kill, time.Since(start))
	if busy > 0 {
		r.PerSec = round2(float64(r.Create.N) / busy.Seconds())
	}
	return r
}

// serialCreates creates and kills n sandboxes one at a time into create
// and kill and returns the time spent creating.
func serialCreates(ctx context.Context, c *Client, n int, create, kill *Samples) (busy time.Duration) {
	for i := 0; i < n && ctx.Err() == nil; i++ {
		t0 := time.Now()
		id, err := c.Create(ctx)
		d := time.Since(t0)
		busy += d
		create.Add(d, err)
		if err != nil {
			continue
		}
		t1 := time.Now()
		err = c.Kill(context.WithoutCancel(ctx), id)
		kill.Add(time.Since(t1), err)
	}
	return busy
}

// RunBursts creates n sandboxes in bursts of conc simultaneous creates; after
// each burst the created sandboxes are killed, conc at a time, timing each
// kill. Each create's latency is measured from the burst's common start.
// When settle is not nil it is called before each burst: the node's own
// work after the last burst (tearing sandboxes down, refilling the warm
// pool) then is not in the burst's way. Without it the bursts come back to
// back, and the run measures sustained throughput instead.
func RunBursts(ctx context.Context, c *Client, n, conc int, settle func(context.Context)) CreateResult {
	var create, kill Samples
	start := time.Now()
	var busy time.Duration
	for done := 0; done < n && ctx.Err() == nil; {
		if settle != nil {
			settle(ctx)
		}
		k := min(conc, n-done)
		ids := make([]string, k)
		var wg sync.WaitGroup
		gate := make(chan struct{})
		var t time.Time
		for i := range k {
			wg.Go(func() {
				<-gate
				id, err := c.Create(ctx)
				create.Add(time.Since(t), err) // from the burst's start
				ids[i] = id
			})
		}
		t = time.Now()
		close(gate)
		wg.Wait()
		busy += time.Since(t)
		killAll(context.WithoutCancel(ctx), c, ids, conc, &kill)
		done += k
	}
	r := finish(conc, &create, &kill, time.Since(start))
	if busy > 0 {
		r.PerSec = round2(float64(r.Create.N) / busy.Seconds())
	}
	return r
}

// killAll kills ids (skipping empty ones) with at most conc in flight,
// recording each kill's latency in s when s is not nil.
func killAll(ctx context.Context, c *Client, ids []string, conc int, s *Samples) {
	sem := make(chan struct{}, max(conc, 1))
	var wg sync.WaitGroup
	for _, id := range ids {
		if id == "" {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t0 := time.Now()
			err := c.Kill(ctx, id)
			if s != nil {
				s.Add(time.Since(t0), err)
			}
		})
	}
	wg.Wait()
}

func finish(conc int, create, kill *Samples, wall time.Duration) CreateResult {
	r := CreateResult{Concurrency: conc, Create: create.Summary(), Kill: kill.Summary(), WallSec: round2(wall.Seconds())}
	if wall > 0 {
		r.PerSec = round2(float64(r.Create.N) / wall.Seconds())
	}
	return r
}
