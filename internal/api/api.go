// Package api is cube-api: the E2B-compatible REST control plane, a plain
// net/http handler over a master.Master.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/master"
)

// ClientID is the deprecated, schema-required clientID of every sandbox.
const ClientID = "cube"

// KeyVerifier checks an API key and returns the key's id; it returns an
// error wrapping errdefs.ErrUnauthenticated for an unknown or revoked key.
type KeyVerifier interface {
	VerifyKey(ctx context.Context, plaintext string) (string, error)
}

type server struct {
	m    *master.Master
	keys KeyVerifier
	log  *slog.Logger
}

// New returns the cube-api handler. Every route except GET /health needs an
// API key (X-API-Key or Authorization: Bearer).
func New(m *master.Master, keys KeyVerifier, logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.Default()
	}
	s := &server{m: m, keys: keys, log: logger.With("component", "cube-api")}
	mux := http.NewServeMux()
	auth := s.authenticated
	mux.HandleFunc("GET /health", s.health)

	mux.Handle("POST /v2/sandboxes", auth(s.createSandbox))
	mux.Handle("POST /sandboxes", auth(s.createSandbox)) // deprecated v1
	mux.Handle("GET /v2/sandboxes", auth(s.listSandboxes))
	mux.Handle("GET /sandboxes", auth(s.listSandboxesV1)) // deprecated v1
	mux.Handle("GET /sandboxes/{sandboxID}", auth(s.getSandbox))
	mux.Handle("DELETE /sandboxes/{sandboxID}", auth(s.killSandbox))
	mux.Handle("POST /sandboxes/{sandboxID}/timeout", auth(s.setTimeout))
	mux.Handle("POST /sandboxes/{sandboxID}/refreshes", auth(s.refresh))
	mux.Handle("POST /v2/sandboxes/{sandboxID}/connect", auth(s.connect))
	mux.Handle("POST /sandboxes/{sandboxID}/connect", auth(s.connect)) // deprecated v1
	mux.Handle("POST /sandboxes/{sandboxID}/resume", auth(s.resume))   // deprecated v1
	mux.Handle("POST /sandboxes/{sandboxID}/pause", auth(s.pause))
	mux.Handle("GET /sandboxes/{sandboxID}/metrics", auth(s.metrics))
	mux.Handle("PUT /sandboxes/{sandboxID}/network", auth(s.updateNetwork))
	mux.Handle("POST /sandboxes/{sandboxID}/fork", auth(s.notImplemented("fork")))
	mux.Handle("POST /sandboxes/{sandboxID}/snapshots", auth(s.notImplemented("snapshots")))
	mux.Handle("GET /snapshots", auth(s.notImplemented("snapshots")))
	return s.logged(jsonFallback(mux))
}

// authenticated wraps h with API-key checking.
func (s *server) authenticated(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if v, ok := cutPrefixFold(r.Header.Get("Authorization"), "Bearer "); ok {
				key = strings.TrimSpace(v)
			}
		}
		if key == "" {
			writeErrorMessage(w, http.StatusUnauthorized, "missing API key: send it in the X-API-Key header")
			return
		}
		if _, err := s.keys.VerifyKey(r.Context(), key); err != nil {
			if status := errdefs.HTTPStatus(err); status != http.StatusUnauthorized {
				s.writeError(w, r, err)
				return
			}
			writeErrorMessage(w, http.StatusUnauthorized, "invalid API key")
			return
		}
		h(w, r)
	})
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return "", false
	}
	return s[len(prefix):], true
}

// jsonFallback answers unknown paths and wrong methods with JSON errors
// instead of ServeMux's plain-text ones.
func jsonFallback(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		rec := &headerRecorder{header: http.Header{}}
		mux.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", rec.header.Get("Allow"))
			writeErrorMessage(w, rec.status, "method "+r.Method+" is not allowed on "+r.URL.Path)
		case http.StatusMovedPermanently, http.StatusPermanentRedirect:
			http.Redirect(w, r, rec.header.Get("Location"), rec.status)
		default:
			writeErrorMessage(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
		}
	})
}

// headerRecorder captures what ServeMux's fallback handlers would answer.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (h *headerRecorder) WriteHeader(code int) {
	if h.status == 0 {
		h.status = code
	}
}

// logged logs every request at debug level.
func (s *server) logged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		s.log.LogAttrs(r.Context(), slog.LevelDebug, "request",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", sw.status), slog.Duration("duration", time.Since(start)))
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *server) notImplemented(what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeErrorMessage(w, http.StatusNotImplemented, what+" is not implemented by this Cube server")
	}
}
