package envd

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cube-dev/cube/api/gen/envd/filesystem/filesystemconnect"
	"github.com/cube-dev/cube/api/gen/envd/process/processconnect"
	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/envd/files"
	"github.com/cube-dev/cube/internal/envd/filesystem"
	"github.com/cube-dev/cube/internal/envd/process"
)

// maxRPCMessage bounds one Connect request message (e.g. SendInput data).
const maxRPCMessage = 32 << 20

// Server is envd's HTTP handler. Close it to kill the processes and
// watchers it started.
type Server struct {
	settings *account.Settings
	process  *process.Service
	fs       *filesystem.Service
	files    *files.Handler
	mux      *http.ServeMux
	// rpc holds the Connect services' handlers, built on their first call.
	rpc [2]*lazyHandler
	// errw writes Connect errors (unauthenticated RPCs); built on first use
	// like the services' handlers.
	errw func() *connect.ErrorWriter

	mu       sync.RWMutex
	token    string
	lastInit time.Time
}

var _ http.Handler = (*Server)(nil)

// NewServer returns envd's handler for cfg.
func NewServer(cfg Config) *Server {
	settings := account.NewSettings(cfg.PasswdFile, cfg.GroupFile)
	settings.SetDefaultUser(cfg.DefaultUser)
	settings.SetDefaultWorkdir(cfg.DefaultWorkdir)
	settings.MergeEnvVars(cfg.EnvVars)
	s := &Server{
		settings: settings,
		process:  process.New(settings),
		fs:       filesystem.New(settings),
		files:    files.NewHandler(settings),
		mux:      http.NewServeMux(),
		errw:     sync.OnceValue(func() *connect.ErrorWriter { return connect.NewErrorWriter() }),
		token:    cfg.AccessToken,
	}
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxRPCMessage)}
	s.rpc[0] = newLazyHandler(func() http.Handler {
		_, h := s.process.Handler(opts...)
		return h
	})
	s.rpc[1] = newLazyHandler(func() http.Handler {
		_, h := s.fs.Handler(opts...)
		return h
	})
	s.mux.Handle(processPath, s.requireToken(s.rpc[0], true))
	s.mux.Handle(filesystemPath, s.requireToken(s.rpc[1], true))
	s.mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.mux.Handle("/files", s.requireFileAuth(s.files))
	s.mux.Handle("GET /envs", s.requireToken(http.HandlerFunc(s.envs), false))
	s.mux.Handle("POST /init", s.requireToken(http.HandlerFunc(s.handleInit), false))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		files.WriteError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return s
}

// The Connect services' mount paths, as their generated handlers return
// them (TestConnectPaths); the handlers are built on the first call
// (lazyHandler).
const (
	processPath    = "/" + processconnect.ProcessName + "/"
	filesystemPath = "/" + filesystemconnect.FilesystemName + "/"
)

// ServeHTTP serves envd's routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// Close kills all processes started through s (waiting for them up to ctx's
// deadline) and stops all watchers.
func (s *Server) Close(ctx context.Context) error {
	return errors.Join(s.process.Close(ctx), s.fs.Close())
}

func (s *Server) accessToken() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.token
}

func (s *Server) tokenOK(r *http.Request) bool {
	want := s.accessToken()
	if want == "" {
		return true
	}
	got := r.Header.Get("X-Access-Token")
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// requireToken rejects requests without the access token: as a Connect
// error for RPCs, as a JSON 401 otherwise.
func (s *Server) requireToken(next http.Handler, rpc bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.tokenOK(r) {
			next.ServeHTTP(w, r)
			return
		}
		if rpc && s.errw().IsSupported(r) {
			_ = s.errw().Write(w, r, connect.NewError(connect.CodeUnauthenticated, errors.New("missing or wrong X-Access-Token")))
			return
		}
		files.WriteError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token")
	})
}

// requireFileAuth accepts the access token or an E2B signed URL.
func (s *Server) requireFileAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.tokenOK(r) {
			next.ServeHTTP(w, r)
			return
		}
		op := files.OpRead
		if r.Method == http.MethodPost {
			op = files.OpWrite
		}
		if err := files.VerifySignature(r.URL.Query(), op, s.accessToken(), time.Now()); err != nil {
			files.WriteError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token, and no valid signature: "+err.Error())
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) envs(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.settings.EnvVars())
}

// initRequest is the body of POST /init.
type initRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	AccessToken    *string           `json:"accessToken"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	Timestamp      *time.Time        `json:"timestamp"`
}

// handleInit applies an /init call. Calls older than the last applied one (by
// timestamp) are ignored, so a delayed retry cannot undo a newer init.
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	var req initRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&req); err != nil {
		files.WriteError(w, http.StatusBadRequest, "bad /init body: "+err.Error())
		return
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			files.WriteError(w, http.StatusBadRequest, fmt.Sprintf("bad environment variable name %q", k))
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Timestamp != nil {
		if req.Timestamp.Before(s.lastInit) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		s.lastInit = *req.Timestamp
	}
	s.settings.MergeEnvVars(req.EnvVars)
	if req.DefaultUser != nil {
		s.settings.SetDefaultUser(*req.DefaultUser)
	}
	if req.DefaultWorkdir != nil {
		s.settings.SetDefaultWorkdir(*req.DefaultWorkdir)
	}
	if req.AccessToken != nil {
		s.token = *req.AccessToken
	}
	w.WriteHeader(http.StatusNoContent)
}
