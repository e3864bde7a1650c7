// Package leader picks one leader among server replicas for the background
// loops that must run exactly once per cluster (TTL expiry, node health).
//
// An Elector grants leadership; Run runs a function only while this replica
// holds it and cancels the function's context the moment it is lost. Two
// electors are provided: Always (one replica, e.g. SQLite: always the
// leader) and Postgres (a PostgreSQL session advisory lock held on a
// dedicated connection).
package leader

import (
	"context"
	"errors"
)

// ErrLost is the cause of a leadership context's cancellation when
// leadership was lost (connection gone, lock no longer held).
var ErrLost = errors.New("leadership lost")

// Elector grants leadership to at most one replica at a time.
type Elector interface {
	// Acquire blocks until this replica is the leader or ctx is done, in
	// which case it returns ctx's error. The returned context is canceled
	// (with cause ErrLost) as soon as leadership is lost, or when ctx is
	// done. release gives leadership up; it must be called exactly once and
	// returns after the lock is let go.
	Acquire(ctx context.Context) (leading context.Context, release func(), err error)
}

// Run runs fn each time this replica becomes the leader, until ctx is done.
// fn's context is canceled when leadership is lost; Run waits for fn to
// return, gives leadership up and campaigns again. If fn returns while
// leadership is still held, Run gives it up and returns fn's error. Run
// returns nil once ctx is done.
func Run(ctx context.Context, e Elector, fn func(ctx context.Context) error) error {
	for {
		leading, release, err := e.Acquire(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		err = fn(leading)
		stillLeading := leading.Err() == nil
		release()
		switch {
		case ctx.Err() != nil:
			return nil
		case stillLeading:
			return err
		}
	}
}

// Always is the elector of a single replica: it is always the leader.
type Always struct{}

// Acquire returns at once with a context that ends with ctx.
func (Always) Acquire(ctx context.Context) (context.Context, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	leading, cancel := context.WithCancel(ctx)
	return leading, cancel, nil
}

var _ Elector = Always{}
