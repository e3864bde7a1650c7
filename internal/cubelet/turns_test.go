package cubelet

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestTakeTurnWaitsForAFreeTurn(t *testing.T) {
	c := &Cubelet{turns: newTurns(1)}
	ctx := context.Background()
	endFirst, err := c.takeTurn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan func())
	go func() {
		end, err := c.takeTurn(ctx)
		if err != nil {
			t.Error(err)
			close(started)
			return
		}
		started <- end
	}()
	select {
	case <-started:
		t.Fatal("a second create ran while the only turn was taken")
	case <-time.After(50 * time.Millisecond):
	}
	endFirst()
	select {
	case end := <-started:
		end()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting create did not run after the turn ended")
	}
}

func TestTakeTurnGivesUpWithItsCaller(t *testing.T) {
	c := &Cubelet{turns: newTurns(1)}
	end, err := c.takeTurn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.takeTurn(ctx)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting create whose caller left: got %v, want context.Canceled", err)
	}
	end()
	// The abandoned wait holds no turn.
	if end, err = c.takeTurn(context.Background()); err != nil {
		t.Fatal(err)
	}
	end()
}

func TestNewTurns(t *testing.T) {
	if newTurns(-1) != nil {
		t.Fatal("negative parallelism must mean no limit")
	}
	c := &Cubelet{}
	end, err := c.takeTurn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	end()
	def := newTurns(0)
	for i := range DefaultCreateParallelism() {
		if !def.TryAcquire(1) {
			t.Fatalf("default admits %d creates, want %d", i, DefaultCreateParallelism())
		}
	}
	if def.TryAcquire(1) {
		t.Fatalf("default admits more than %d creates", DefaultCreateParallelism())
	}
}
