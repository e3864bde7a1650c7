package cubevs

import (
	"errors"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// TestOpenRefusesTransitRoutedElsewhere: a second dataplane whose transit
// subnet the host already routes via the first one's veth is refused, so
// host traffic can never silently reach the wrong dataplane.
func TestOpenRefusesTransitRoutedElsewhere(t *testing.T) {
	requireRoot(t)
	first := testConfig(t)
	openDP(t, first)
	second := testConfig(t)
	second.Transit = first.Transit
	d, err := Open(ctxT(t), second)
	if err == nil {
		d.Destroy(ctxT(t))
		t.Fatal("second dataplane on the same transit subnet was accepted")
	}
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("err = %v, want ErrConflict", err)
	}
	// The refused Open left nothing of its own behind.
	assertNothingLeft(t, second)
}
