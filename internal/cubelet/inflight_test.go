package cubelet

import "testing"

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestInflightTellsWhenQuiet: the refill's wait for a quiet moment ends when
// the last create in flight ends, not before.
func TestInflightTellsWhenQuiet(t *testing.T) {
	var f inflight
	if !isClosed(f.quiet()) {
		t.Fatal("nothing in flight, yet not quiet")
	}
	endA := f.start()
	endB := f.start()
	q := f.quiet()
	endA()
	endA() // ending twice counts once
	if isClosed(q) {
		t.Fatal("quiet while a create is still in flight")
	}
	endB()
	if !isClosed(q) {
		t.Fatal("not quiet after the last create ended")
	}
	endC := f.start()
	if isClosed(f.quiet()) {
		t.Fatal("quiet again with a new create in flight")
	}
	endC()
	if !isClosed(f.quiet()) {
		t.Fatal("not quiet after the new create ended")
	}
}
