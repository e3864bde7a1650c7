package leader

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestAlwaysRunsUntilCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var fnCtx context.Context
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Always{}, func(ctx context.Context) error {
			fnCtx = ctx
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("fn not started")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if fnCtx.Err() == nil {
		t.Fatal("fn context still live after Run returned")
	}
	if _, _, err := (Always{}).Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire on a done context: %v", err)
	}
}

func TestRunReturnsFnErrorWhileLeading(t *testing.T) {
	boom := errors.New("boom")
	if err := Run(context.Background(), Always{}, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want boom", err)
	}
	if err := Run(context.Background(), Always{}, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}

// flaky grants leadership, then takes it away after lease; it counts grants
// and releases.
type flaky struct {
	lease    time.Duration
	grants   atomic.Int32
	releases atomic.Int32
	failWith error
}

func (f *flaky) Acquire(ctx context.Context) (context.Context, func(), error) {
	if f.failWith != nil {
		return nil, nil, f.failWith
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	f.grants.Add(1)
	leading, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(f.lease, func() { cancel(ErrLost) })
	return leading, func() { timer.Stop(); cancel(context.Canceled); f.releases.Add(1) }, nil
}

func TestRunCampaignsAgainAfterLoss(t *testing.T) {
	e := &flaky{lease: 20 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	var runs atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, e, func(ctx context.Context) error {
			runs.Add(1)
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), ErrLost) && !errors.Is(context.Cause(ctx), context.Canceled) {
				t.Errorf("cause = %v", context.Cause(ctx))
			}
			return errors.New("ignored: leadership was lost")
		})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runs.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("fn ran %d times, want >= 3 after repeated losses", runs.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if g, r := e.grants.Load(), e.releases.Load(); g != r {
		t.Fatalf("%d grants but %d releases", g, r)
	}
}

func TestRunReturnsElectorError(t *testing.T) {
	bad := errors.New("misconfigured")
	if err := Run(context.Background(), &flaky{failWith: bad}, func(context.Context) error { return nil }); !errors.Is(err, bad) {
		t.Fatalf("Run = %v, want the elector's error", err)
	}
}
