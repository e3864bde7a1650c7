package nodestore

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Group commit. bbolt runs one writer at a time and each commit writes the
// changed pages and meta page (and, with sync on, an fdatasync; see Open):
// a burst of creates (three writes each) would queue on that lock and pay
// one commit per write. Writes therefore go
// through update, which commits whatever writes are queued together in one
// transaction. A lone write is committed at once, as before (no delay is
// added to wait for company); a write that arrives while a commit runs
// joins the next one.

// op is one queued write.
type op struct {
	fn func(*bolt.Tx) error
	// applied runs once fn's write is committed, before the next commit
	// (the record cache follows the file in commit order).
	applied func()
	done    chan error    // the write's result
	lead    chan struct{} // told to commit the queue itself
}

// committer queues writes; one caller at a time (the leader) commits.
type committer struct {
	mu      sync.Mutex
	queue   []*op
	leading bool
}

// update runs fn in a write transaction, possibly shared with other
// concurrent writes, and returns fn's error or the commit's. fn may run
// more than once (again alone, when a shared transaction failed), so it
// must only write through tx and set results it computes from tx.
func (s *Store) update(fn func(*bolt.Tx) error, applied func()) error {
	o := &op{fn: fn, applied: applied, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	s.c.mu.Lock()
	s.c.queue = append(s.c.queue, o)
	leader := !s.c.leading
	s.c.leading = true
	s.c.mu.Unlock()
	if !leader {
		select {
		case err := <-o.done:
			return err
		case <-o.lead:
		}
	}
	s.c.mu.Lock()
	batch := s.c.queue
	s.c.queue = nil
	s.c.mu.Unlock()
	s.commit(batch)
	// Hand the lead to the oldest write queued meanwhile, so no caller
	// keeps committing for others under sustained load.
	s.c.mu.Lock()
	if len(s.c.queue) > 0 {
		s.c.queue[0].lead <- struct{}{}
	} else {
		s.c.leading = false
	}
	s.c.mu.Unlock()
	return <-o.done
}

// commit writes batch in one transaction; when that fails, each write is
// retried in a transaction of its own so one bad write fails alone.
func (s *Store) commit(batch []*op) {
	if len(batch) > 1 {
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, o := range batch {
				if err := o.fn(tx); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			for _, o := range batch {
				o.committed(nil)
			}
			return
		}
	}
	for _, o := range batch {
		o.committed(s.db.Update(o.fn))
	}
}

// committed reports the write's result, applying it first if it is in.
func (o *op) committed(err error) {
	if err == nil && o.applied != nil {
		o.applied()
	}
	o.done <- err
}
