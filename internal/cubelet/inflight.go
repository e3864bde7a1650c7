package cubelet

import "sync"

// inflight counts creates in progress and tells when there are none, so
// a pool refill can wait for a quiet moment without polling.
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while n == 0; replaced when n leaves 0
}

// closedChan is returned by quiet when nothing is in flight.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// start counts one more create; the returned func ends it.
func (f *inflight) start() (end func()) {
	f.mu.Lock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
	f.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.n--
			if f.n == 0 {
				close(f.idle)
			}
			f.mu.Unlock()
		})
	}
}

// quiet returns a channel that is closed once no create is in flight.
func (f *inflight) quiet() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		return closedChan
	}
	return f.idle
}
