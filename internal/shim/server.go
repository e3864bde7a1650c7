package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Workload is what a shim supervises: one sandbox's init and everything it
// spawned.
type Workload interface {
	// Pid is the host pid of the init.
	Pid() int
	// Wait blocks until the init has exited and returns how. Called once.
	Wait() ExitStatus
	// Kill kills every process of the workload and returns once they are gone.
	Kill(ctx context.Context) error
	// Freeze and Thaw pause and resume every process of the workload.
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
}

// Launcher starts the workload described by the files in stateDir and
// returns once it is ready. It runs inside the detached shim; on error it
// must leave no process running.
type Launcher func(ctx context.Context, stateDir string) (Workload, error)

// State is the live view of a shim and its sandbox.
type State struct {
	ShimPID   int       `json:"shimPid"`
	InitPID   int       `json:"initPid"`
	Running   bool      `json:"running"`
	Frozen    bool      `json:"frozen"`
	ExitCode  int       `json:"exitCode"`
	Signal    string    `json:"signal,omitempty"`
	StartedAt time.Time `json:"startedAt"`
	ExitedAt  time.Time `json:"exitedAt,omitzero"`
	Version   string    `json:"version"`
}

// server is the shim's HTTP API over its workload.
type server struct {
	w      Workload
	mu     sync.Mutex
	state  State
	exited chan struct{} // closed once exit.json is written
}

func newServer(w Workload, st State) *server {
	return &server{w: w, state: st, exited: make(chan struct{})}
}

// markExited records the init's end and releases /kill waiters.
func (s *server) markExited(e ExitStatus) {
	s.mu.Lock()
	s.state.Running, s.state.Frozen = false, false
	s.state.ExitCode, s.state.Signal, s.state.ExitedAt = e.ExitCode, e.Signal, e.ExitedAt
	s.mu.Unlock()
	close(s.exited)
}

func (s *server) snapshot() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", func(rw http.ResponseWriter, r *http.Request) {
		writeJSON(rw, http.StatusOK, s.snapshot())
	})
	mux.HandleFunc("POST /kill", s.kill)
	mux.HandleFunc("POST /freeze", func(rw http.ResponseWriter, r *http.Request) { s.setFrozen(rw, r, true) })
	mux.HandleFunc("POST /thaw", func(rw http.ResponseWriter, r *http.Request) { s.setFrozen(rw, r, false) })
	return mux
}

// kill kills the workload and answers once the init's exit is recorded.
func (s *server) kill(rw http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	select {
	case <-s.exited:
	default:
		if err := s.w.Kill(ctx); err != nil {
			writeError(rw, fmt.Errorf("kill sandbox: %w", err))
			return
		}
		select {
		case <-s.exited:
		case <-ctx.Done():
			writeError(rw, fmt.Errorf("init did not exit after kill: %w", errdefs.ErrUnavailable))
			return
		}
	}
	writeJSON(rw, http.StatusOK, s.snapshot())
}

func (s *server) setFrozen(rw http.ResponseWriter, r *http.Request, frozen bool) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if !s.snapshot().Running {
		writeError(rw, fmt.Errorf("sandbox is not running: %w", errdefs.ErrFailedPrecondition))
		return
	}
	op := s.w.Thaw
	if frozen {
		op = s.w.Freeze
	}
	if err := op(ctx); err != nil {
		writeError(rw, err)
		return
	}
	s.mu.Lock()
	s.state.Frozen = frozen
	s.mu.Unlock()
	writeJSON(rw, http.StatusOK, s.snapshot())
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(rw http.ResponseWriter, code int, v any) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(v)
}

func writeError(rw http.ResponseWriter, err error) {
	writeJSON(rw, errdefs.HTTPStatus(err), errorBody{Error: err.Error()})
}

// kindOf maps an HTTP status (as produced by errdefs.HTTPStatus) back to an
// error kind, so errors.Is works across the socket.
func kindOf(code int) error {
	for _, k := range []error{
		errdefs.ErrNotFound, errdefs.ErrConflict, errdefs.ErrInvalidArgument, errdefs.ErrFailedPrecondition,
		errdefs.ErrUnavailable, errdefs.ErrResourceExhausted, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied,
	} {
		if errdefs.HTTPStatus(k) == code {
			return k
		}
	}
	return errors.New("internal error")
}
