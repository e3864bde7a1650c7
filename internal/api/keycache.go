package api

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"
)

// keyCacheTTL is how long a verified API key is trusted without asking the
// store again: a key revoked with `cube key revoke` stops working on every
// server within this time.
const keyCacheTTL = 2 * time.Second

// cachedKeys remembers keys the store verified, for keyCacheTTL. Every API
// call verifies its key, and the store's check is a query over all keys:
// in a burst of 50 creates it was a tenth of the server's CPU. Only valid
// keys are kept (so the cache holds at most one entry per key), by their
// SHA-256, never in plain text.
type cachedKeys struct {
	store KeyVerifier
	now   func() time.Time

	mu      sync.Mutex
	entries map[[sha256.Size]byte]cachedKey
}

type cachedKey struct {
	id      string
	expires time.Time
}

func newCachedKeys(store KeyVerifier) *cachedKeys {
	return &cachedKeys{store: store, now: time.Now, entries: map[[sha256.Size]byte]cachedKey{}}
}

// VerifyKey returns the id of the key plaintext, from the cache while the
// store's answer is fresh.
func (c *cachedKeys) VerifyKey(ctx context.Context, plaintext string) (string, error) {
	sum := sha256.Sum256([]byte(plaintext))
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[sum]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.id, nil
	}
	id, err := c.store.VerifyKey(ctx, plaintext)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		delete(c.entries, sum)
		return "", err
	}
	for k, old := range c.entries { // expired entries of other keys
		if !now.Before(old.expires) {
			delete(c.entries, k)
		}
	}
	c.entries[sum] = cachedKey{id: id, expires: now.Add(keyCacheTTL)}
	return id, nil
}
