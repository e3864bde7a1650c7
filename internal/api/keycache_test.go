package api

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// countingKeys counts the store's verifications.
type countingKeys struct {
	KeyVerifier
	calls atomic.Int32
}

func (c *countingKeys) VerifyKey(ctx context.Context, plaintext string) (string, error) {
	c.calls.Add(1)
	return c.KeyVerifier.VerifyKey(ctx, plaintext)
}

// TestCachedKeys: a verified key is trusted for keyCacheTTL without asking
// the store; a key revoked meanwhile stops working once that has passed;
// invalid keys are never cached.
func TestCachedKeys(t *testing.T) {
	ctx := context.Background()
	st, keys := openKeyStore(t, "cached")
	key := keys[0]
	counted := &countingKeys{KeyVerifier: st}
	c := newCachedKeys(counted)
	now := time.Now()
	c.now = func() time.Time { return now }

	id, err := c.VerifyKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := c.VerifyKey(ctx, key); err != nil || again != id || counted.calls.Load() != 1 {
		t.Fatalf("second call: %q %v, store asked %d times, want once", again, err, counted.calls.Load())
	}
	if err := st.RevokeKey(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.VerifyKey(ctx, key); err != nil {
		t.Fatalf("within the TTL after revocation: %v", err)
	}
	now = now.Add(keyCacheTTL)
	if _, err := c.VerifyKey(ctx, key); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("revoked key after the TTL: %v, want ErrUnauthenticated", err)
	}
	before := counted.calls.Load()
	for range 3 {
		if _, err := c.VerifyKey(ctx, "not-a-key"); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Fatalf("invalid key: %v", err)
		}
	}
	if n := counted.calls.Load() - before; n != 3 {
		t.Fatalf("invalid key reached the store %d times in 3 calls, want 3 (never cached)", n)
	}
}
