package store

import "context"

// writeGate lets one write at a time into the embedded SQLite database.
// SQLite has one writer; when several connections of the pool try at once,
// all but one get SQLITE_BUSY and sleep in its busy handler (1, 2, 5, 10 ...
// 100 ms steps) before trying again, so a burst of 50 sandbox creates took
// up to ~110 ms per insert (BenchmarkBurstOfCreates). Waiting here instead
// hands the lock over at once, in arrival order (a channel's blocked
// senders are queued). Reads do not pass it: WAL readers never wait for
// the writer. PostgreSQL has row locks and needs no gate (nil).
type writeGate chan struct{}

func newWriteGate() writeGate { return make(writeGate, 1) }

// enter waits for the gate, or for ctx to end.
func (g writeGate) enter(ctx context.Context) error {
	if g == nil {
		return nil
	}
	select {
	case g <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave opens the gate for the next writer.
func (g writeGate) leave() {
	if g != nil {
		<-g
	}
}
