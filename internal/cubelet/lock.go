package cubelet

import "sync"

// idLock is one sandbox id's lock and how many hold or wait for it.
type idLock struct {
	mu   sync.Mutex
	refs int
}

// lock serialises operations on one sandbox id. An id's entry goes when
// its last holder or waiter is done, so the map does not grow with every
// sandbox the node ever ran.
func (c *Cubelet) lock(id string) func() {
	c.locksMu.Lock()
	l := c.locks[id]
	if l == nil {
		l = &idLock{}
		c.locks[id] = l
	}
	l.refs++
	c.locksMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		c.locksMu.Lock()
		if l.refs--; l.refs == 0 {
			delete(c.locks, id)
		}
		c.locksMu.Unlock()
	}
}
