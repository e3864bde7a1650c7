package envd

import (
	"net/http"
	"sync"
	"sync/atomic"
)

// lazyHandler builds the handler it stands for on its first request.
// envd's two Connect services cost about 1 ms of CPU to build (their
// protobuf descriptors are unmarshalled in full, and connect makes handlers
// per method and protocol), a fifth of envd's start; a create calls only
// /health and /init, so that cost moves to the sandbox's first RPC of each
// service (~0.2 ms more for it).
type lazyHandler struct {
	once  sync.Once
	build func() http.Handler
	h     http.Handler
	done  atomic.Bool
}

func newLazyHandler(build func() http.Handler) *lazyHandler {
	return &lazyHandler{build: build}
}

// ServeHTTP builds the handler once, then serves r with it.
func (l *lazyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.once.Do(func() {
		l.h = l.build()
		l.done.Store(true)
	})
	l.h.ServeHTTP(w, r)
}

// built reports whether the handler has been built.
func (l *lazyHandler) built() bool { return l.done.Load() }
