package cubelet

import (
	"testing"
	"time"
)

// The per-sandbox locks map keeps an entry only while someone holds or
// waits for it: before, every id the node ever saw stayed in it.
func TestLockEntriesGoWhenReleased(t *testing.T) {
	c := &Cubelet{locks: map[string]*idLock{}}
	unlockA := c.lock("a")
	got := make(chan func())
	go func() { got <- c.lock("a") }() // waits for the first holder
	for {
		c.locksMu.Lock()
		refs := c.locks["a"].refs
		c.locksMu.Unlock()
		if refs == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	unlockA()
	unlockB := <-got
	c.lock("b")()
	c.locksMu.Lock()
	if _, ok := c.locks["b"]; ok || len(c.locks) != 1 {
		t.Errorf("locks after b's release: %v", c.locks)
	}
	c.locksMu.Unlock()
	unlockB()
	if len(c.locks) != 0 {
		t.Errorf("locks left: %v", c.locks)
	}
}
