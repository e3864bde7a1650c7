package interp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/errdefs/errhttp"
)

// maxRequestBody bounds a request body (code included).
const maxRequestBody = 16 << 20

// Handler serves the code-interpreter HTTP API.
func (it *Interp) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, "OK") })
	mux.HandleFunc("POST /execute", it.serveExecute)
	mux.HandleFunc("POST /contexts", it.tokenIfSent(it.serveCreateContext))
	mux.HandleFunc("GET /contexts", it.tokenIfSent(func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, it.Contexts()) }))
	mux.HandleFunc("DELETE /contexts/{id}", it.tokenIfSent(func(w http.ResponseWriter, r *http.Request) {
		if err := it.RemoveContext(r.PathValue("id")); err != nil {
			errhttp.Write(w, err)
			return
		}
		writeJSON(w, nil)
	}))
	mux.HandleFunc("POST /contexts/{id}/restart", it.tokenIfSent(func(w http.ResponseWriter, r *http.Request) {
		c, err := it.Context(r.PathValue("id"))
		if err == nil {
			err = c.restart(r.Context())
		}
		if err != nil {
			errhttp.Write(w, err)
			return
		}
		writeJSON(w, nil)
	}))
	return cors(mux)
}

// cors lets browser clients call the server from any origin, as upstream's
// server does; access control is the sandbox proxy's (traffic token) and
// envd's access token's (auth.go).
func cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		if r.Method == http.MethodOptions {
			w.Header().Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
			w.Header().Set("Access-Control-Allow-Headers", "*")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ExecuteRequest is the body of POST /execute as @e2b/code-interpreter
// 2.8.0 sends it (runCode): absent options are absent or null.
type ExecuteRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}

// CreateContextRequest is the body of POST /contexts.
type CreateContextRequest struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxRequestBody))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (it *Interp) serveCreateContext(w http.ResponseWriter, r *http.Request) {
	var req CreateContextRequest
	if err := decodeBody(r, &req); err != nil {
		errhttp.Write(w, err)
		return
	}
	c, err := it.CreateContext(r.Context(), req.Language, req.Cwd)
	if err != nil {
		errhttp.Write(w, err)
		return
	}
	writeJSON(w, c)
}

// serveExecute runs code and streams its output as newline-delimited JSON
// objects (stdout, stderr, result, error, number_of_executions, keepalive)
// ending with {"type":"end_of_execution"}. Errors found before the code
// runs (bad request, unknown context or language, no kernel) are HTTP
// errors instead.
func (it *Interp) serveExecute(w http.ResponseWriter, r *http.Request) {
	// The token first, as envd does: a caller without it learns nothing,
	// not even whether a context exists.
	global, err := it.sandboxEnv(r.Context(), r.Header.Get(tokenHeader))
	if err != nil {
		errhttp.Write(w, err)
		return
	}
	var req ExecuteRequest
	if err := decodeBody(r, &req); err != nil {
		errhttp.Write(w, err)
		return
	}
	if req.Code == nil {
		errhttp.Write(w, fmt.Errorf("code is required: %w", errdefs.ErrInvalidArgument))
		return
	}
	if req.ContextID != "" && req.Language != "" {
		errhttp.Write(w, fmt.Errorf("only one of context_id or language can be given: %w", errdefs.ErrInvalidArgument))
		return
	}
	var c *Context
	if req.ContextID != "" {
		c, err = it.Context(req.ContextID)
	} else {
		c, err = it.defaultContext(req.Language)
	}
	if err != nil {
		errhttp.Write(w, err)
		return
	}
	ctx := r.Context()
	c.run.Lock()
	defer c.run.Unlock()
	k, err := c.kernel(ctx)
	if err != nil {
		errhttp.Write(w, err)
		return
	}
	undo, err := c.setEnv(ctx, k, global, req.EnvVars)
	if err != nil {
		errhttp.Write(w, err)
		return
	}

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	lw := &lineWriter{w: w, rc: http.NewResponseController(w)}
	lw.flush()
	err = k.execute(ctx, *req.Code, false, lw.write)
	switch {
	case errors.Is(err, errKernelStuck):
		it.log.Warn("kernel did not stop after an interrupt; stopping it", "context", c.ID)
		k.kill()
	case err != nil:
		it.log.Info("execution ended early", "context", c.ID, "err", err)
	case undo != "":
		if err := k.execute(ctx, undo, true, func(any) error { return nil }); err != nil {
			it.log.Warn("restore env vars", "context", c.ID, "err", err)
		}
	}
	_ = lw.write(map[string]string{"type": "end_of_execution"})
}

// lineWriter writes one JSON object per line and flushes it at once: the
// client shows output while the code still runs.
type lineWriter struct {
	mu  sync.Mutex
	w   io.Writer
	rc  *http.ResponseController
	err error
}

func (l *lineWriter) write(v any) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, l.err = l.w.Write(append(b, '\n')); l.err == nil {
		l.err = l.rc.Flush()
	}
	return l.err
}

func (l *lineWriter) flush() { _ = l.rc.Flush() }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
