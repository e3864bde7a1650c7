package cubelet

import (
	"context"
	"fmt"
	"runtime"

	"golang.org/x/sync/semaphore"
)

// DefaultCreateParallelism is how many creates run at once by default: two
// per CPU, enough to keep the CPUs busy while some creates wait on a
// sandbox (envd's answer, a cold start's processes).
func DefaultCreateParallelism() int { return 2 * runtime.NumCPU() }

// newTurns makes the create admission of Config.CreateParallelism n.
//
// Why: a create is a few milliseconds of CPU spread over the cubelet, the
// kernel and the sandbox's envd. Fifty creates admitted at once share the
// CPUs fairly and all finish near the end of the burst (measured on 2 CPUs:
// p50 close to the maximum). Admitted a few at a time in arrival order
// (semaphore.Weighted queues waiters FIFO), the same work ends at the same
// time, but the first creates are done early: the median halves.
func newTurns(n int) *semaphore.Weighted {
	if n == 0 {
		n = DefaultCreateParallelism()
	}
	if n < 0 {
		return nil
	}
	return semaphore.NewWeighted(int64(n))
}

// takeTurn waits until the create may run and returns the function that
// ends its turn. A create whose caller gives up while waiting returns the
// context's error and has done nothing.
func (c *Cubelet) takeTurn(ctx context.Context) (func(), error) {
	if c.turns == nil {
		return func() {}, nil
	}
	if err := c.turns.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("wait for a create turn: %w", err)
	}
	return func() { c.turns.Release(1) }, nil
}
