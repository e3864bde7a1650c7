package cubelet

import (
	"sync"

	"github.com/cube-dev/cube/internal/shim"
)

// shimWatches holds a pidfd of every shim a probe found alive, by runtime
// name. The liveness round (every MaintainInterval, over every running
// sandbox) then polls the kernel for a watched shim instead of calling it:
// with 500 sandboxes the round trips woke every shim 2000 times a minute.
// A watched shim that has not exited counts as alive, like one that
// answers; one that has exited, or is not watched yet, gets the full probe,
// and only that probe can call a sandbox dead.
type shimWatches struct {
	mu sync.Mutex
	m  map[string]*shim.ExitWatch
}

// alive reports whether name's shim is watched and has not exited; a
// watch whose shim exited is dropped.
func (w *shimWatches) alive(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	x, ok := w.m[name]
	if !ok {
		return false
	}
	if !x.Exited() {
		return true
	}
	x.Close()
	delete(w.m, name)
	return false
}

// put watches name's shim with x, replacing any older watch.
func (w *shimWatches) put(name string, x *shim.ExitWatch) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]*shim.ExitWatch{}
	}
	if old, ok := w.m[name]; ok {
		old.Close()
	}
	w.m[name] = x
}

// forget stops watching name's shim (its sandbox or slot is torn down).
func (w *shimWatches) forget(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if x, ok := w.m[name]; ok {
		x.Close()
		delete(w.m, name)
	}
}

// closeAll releases every watch.
func (w *shimWatches) closeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, x := range w.m {
		x.Close()
		delete(w.m, name)
	}
}
