// Package api is cube-api: the E2B-compatible REST control plane, a plain
// net/http handler over a master.Master.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/httplog"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/ratelimit"
)

// ClientID is the deprecated, schema-required clientID of every sandbox.
const ClientID = "cube"

// KeyVerifier checks an API key and returns the key's id; it returns an
// error wrapping errdefs.ErrUnauthenticated for an unknown or revoked key.
type KeyVerifier interface {
	VerifyKey(ctx context.Context, plaintext string) (string, error)
}

type server struct {
	m       *master.Master
	keys    KeyVerifier
	log     *slog.Logger
	all     *ratelimit.Limiter // every authenticated request, per key
	creates *ratelimit.Limiter // sandbox creations, per key
	prom    *Metrics           // nil: not measured
	buildRoutes
}

// RateLimits are the per-API-key limits; a zero Limit means unlimited.
type RateLimits struct {
	All     ratelimit.Limit // every authenticated request
	Creates ratelimit.Limit // POST /sandboxes and /v2/sandboxes (counted in All too)
}

// DefaultRateLimits: 1000 requests/s (burst 2000) per key, creates not
// limited apart. A burst of creates the nodes have room for queues on them
// (each node's create-parallelism gate runs creates in arrival order), so
// an evaluation run starting 200 agents at once gets 200 sandboxes, not
// 429s; the request limit only stops a runaway client. Installs shared by
// several teams or untrusted keys set --create-rate-limit (docs/api.md).
var DefaultRateLimits = RateLimits{
	All:     ratelimit.Limit{Rate: 1000, Burst: 2000},
	Creates: ratelimit.Limit{},
}

// Option configures New.
type Option func(*server)

// WithRateLimits replaces DefaultRateLimits; l must be valid (see
// ratelimit.Limit.Validate).
func WithRateLimits(l RateLimits) Option {
	return func(s *server) {
		s.all, s.creates = ratelimit.New(l.All), ratelimit.New(l.Creates)
	}
}

// New returns the cube-api handler. Every route except GET /health needs an
// API key (X-API-Key or Authorization: Bearer); requests past the key's rate
// limits get 429 with a Retry-After header.
func New(m *master.Master, keys KeyVerifier, logger *slog.Logger, opts ...Option) http.Handler {
	if logger == nil {
		logger = slog.Default()
	}
	s := &server{m: m, keys: newCachedKeys(keys), log: logger.With("component", "cube-api")}
	WithRateLimits(DefaultRateLimits)(s)
	for _, o := range opts {
		o(s)
	}
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
	mux.Handle("GET /sandboxes/{sandboxID}/logs", auth(s.logsV1)) // deprecated v1; what `e2b sandbox logs` calls
	mux.Handle("GET /v2/sandboxes/{sandboxID}/logs", auth(s.logsV2))
	mux.Handle("PUT /sandboxes/{sandboxID}/network", auth(s.updateNetwork))
	mux.Handle("POST /sandboxes/{sandboxID}/fork", auth(s.notImplemented("fork")))
	mux.Handle("POST /sandboxes/{sandboxID}/snapshots", auth(s.notImplemented("snapshots")))
	mux.Handle("GET /snapshots", auth(s.notImplemented("snapshots")))
	s.templateRoutes(mux, auth)
	// The access log, request ids and request metrics are the
	// listener's (httplog.Handler around the server's whole mux).
	return jsonFallback(mux)
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
		keyID, err := s.keys.VerifyKey(r.Context(), key)
		if err != nil {
			if status := errdefs.HTTPStatus(err); status != http.StatusUnauthorized {
				s.writeError(w, r, err)
				return
			}
			writeErrorMessage(w, http.StatusUnauthorized, "invalid API key")
			return
		}
		httplog.SetKeyID(r.Context(), keyID)
		if !s.allow(w, keyID, r) {
			return
		}
		h(w, r)
	})
}

// allow applies the key's rate limits; past them it answers 429 with an
// integer Retry-After (seconds), which the E2B SDK honours.
func (s *server) allow(w http.ResponseWriter, keyID string, r *http.Request) bool {
	limit := "all"
	ok, wait := s.all.Allow(keyID)
	if ok && r.Method == http.MethodPost && (r.URL.Path == "/v2/sandboxes" || r.URL.Path == "/sandboxes") {
		limit = "creates"
		ok, wait = s.creates.Allow(keyID)
	}
	if ok {
		return true
	}
	s.prom.rejected(limit)
	secs := ratelimit.RetryAfterSeconds(wait)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeErrorMessage(w, http.StatusTooManyRequests,
		"rate limit exceeded for this API key; retry after "+strconv.Itoa(secs)+"s")
	return false
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

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *server) notImplemented(what string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeErrorMessage(w, http.StatusNotImplemented, what+" is not implemented by this Cube server")
	}
}
