// Package templatebuild is the control-plane side of E2B's template build
// API: it records builds, stores the files of COPY steps, and runs each
// build's steps inside a Cube sandbox through envd, committing the
// sandbox's filesystem as a template (an intermediate one after each step,
// for the step cache, and the final one under the template's name).
//
// A build: POST /v3/templates (RequestBuild: a build record, "waiting"),
// uploads of the COPY archives (FileLink, PutFile), POST /v2/.../builds/{id}
// (StartBuild: validated, then run by a goroutine), and status polls
// (Status: status and log entries by offset). Builds and logs live in the
// control-plane store; a build interrupted by a restart is marked failed.
// A build fromImage (other than E2B's default image, which is `base`) first
// imports the image as a template through Config.Images and starts from it.
package templatebuild

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
)

// Sandboxes is what a build needs of sandboxes; internal/roles implements
// it over the master and the node registry.
type Sandboxes interface {
	// CreateBuildSandbox starts a sandbox of template parent with internet
	// access, WritableOnHost, and a timeout long enough for the build; it
	// returns the sandbox id.
	CreateBuildSandbox(ctx context.Context, parent string, cpuCount, memoryMB int) (id string, err error)
	// Envd returns an HTTP client, base URL and access token reaching envd
	// (port 49983) in sandbox id.
	Envd(ctx context.Context, id string) (hc *http.Client, baseURL, token string, err error)
	// CommitSandbox registers the sandbox's filesystem as a template.
	CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) error
	KillSandbox(ctx context.Context, id string) error
}

// Templates is what exists (the server registry and the nodes' templates).
type Templates interface {
	List(ctx context.Context) ([]TemplateInfo, error)
	// Get returns an error wrapping errdefs.ErrNotFound for an unknown name.
	Get(ctx context.Context, name string) (TemplateInfo, error)
	Delete(ctx context.Context, name string) error
}

// TemplateInfo describes a registered template.
type TemplateInfo struct {
	Name        string
	CPUCount    int
	MemoryMB    int
	DiskSizeMB  int
	EnvdVersion string // "" = DefaultEnvdVersion
	Digest      string // content digest of the rootfs; keys the step cache
	CreatedAt   time.Time
	// The template's process defaults (nil/empty = Cube's).
	Env     map[string]string
	Workdir string
	User    string
}

// Store is the part of the control-plane store builds use.
type Store interface {
	CreateTemplateBuild(ctx context.Context, b store.TemplateBuild) error
	GetTemplateBuild(ctx context.Context, id string) (store.TemplateBuild, error)
	ListTemplateBuilds(ctx context.Context, template string) ([]store.TemplateBuild, error)
	UnfinishedTemplateBuilds(ctx context.Context) ([]store.TemplateBuild, error)
	StartTemplateBuild(ctx context.Context, id string) error
	SetTemplateBuildSandbox(ctx context.Context, id, sandboxID string) error
	FinishTemplateBuild(ctx context.Context, id string, status store.BuildStatus, reason string) (bool, error)
	DeleteTemplateBuilds(ctx context.Context, template string) error
	AppendTemplateBuildLogs(ctx context.Context, buildID string, first int, entries []store.BuildLogEntry) error
	TemplateBuildLogs(ctx context.Context, buildID string, offset, limit int) ([]store.BuildLogEntry, error)
	ListSandboxes(ctx context.Context, f store.ListFilter) (store.Page, error)
}

var _ Store = (store.Store)(nil)

// Defaults of Config.
const (
	DefaultMaxConcurrent  = 2
	DefaultMaxUploadBytes = 1 << 30
	DefaultUploadURLTTL   = time.Hour
	DefaultBuildTimeout   = time.Hour
	// DefaultEnvdVersion is reported for templates that do not say.
	DefaultEnvdVersion = "0.2.0"
	// MaxLogEntries bounds the log entries of one status answer (as E2B).
	MaxLogEntries = 100
)

// Config configures New. Store, Sandboxes, Templates and FilesDir are
// required.
type Config struct {
	Store     Store
	Sandboxes Sandboxes
	Templates Templates
	// FilesDir holds the uploaded COPY archives, usually
	// <data dir>/template-files.
	FilesDir string
	// Secret signs upload URLs. Empty = a random secret per process: the
	// URLs then stop working at a restart, and replicas don't share them.
	Secret []byte
	// PublicURL is the base of upload URLs (e.g. https://cube.example.com);
	// empty = taken from each request (scheme and Host, see baseURL).
	PublicURL string
	Logger    *slog.Logger
	// MaxConcurrent bounds the builds running at once (DefaultMaxConcurrent).
	MaxConcurrent int
	// MaxUploadBytes bounds one COPY archive (DefaultMaxUploadBytes).
	MaxUploadBytes int64
	// UploadURLTTL is how long an upload URL is valid (DefaultUploadURLTTL).
	UploadURLTTL time.Duration
	// BuildTimeout bounds one build (DefaultBuildTimeout).
	BuildTimeout time.Duration
	// Images imports the container images of builds fromImage; nil
	// refuses them (400), except E2B's default image, which is `base`.
	Images Images
	// LeftoverAge is how long step-cache and image templates and uploaded
	// files stay unused before CollectLeftovers removes them
	// (DefaultLeftoverAge); CollectEvery how often it runs
	// (DefaultCollectEvery; negative: never).
	LeftoverAge  time.Duration
	CollectEvery time.Duration
}

// Service runs template builds. Close stops the running ones.
type Service struct {
	cfg   Config
	log   *slog.Logger
	files fileStore
	slots chan struct{}
	now   func() time.Time

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// gcMu is held shared by every running build and exclusively by the
	// collector, which skips a round while builds run.
	gcMu sync.RWMutex
}

// New returns a build service and marks the builds a previous run left
// waiting or building as failed (killing their build sandboxes).
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Sandboxes == nil || cfg.Templates == nil || cfg.FilesDir == "" {
		return nil, errors.New("templatebuild: Store, Sandboxes, Templates and FilesDir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.Secret) == 0 {
		cfg.Secret = make([]byte, 32)
		_, _ = rand.Read(cfg.Secret)
	}
	cfg.MaxConcurrent = orDefault(cfg.MaxConcurrent, DefaultMaxConcurrent)
	cfg.MaxUploadBytes = orDefault(cfg.MaxUploadBytes, DefaultMaxUploadBytes)
	cfg.UploadURLTTL = orDefault(cfg.UploadURLTTL, DefaultUploadURLTTL)
	cfg.BuildTimeout = orDefault(cfg.BuildTimeout, DefaultBuildTimeout)
	cfg.LeftoverAge = orDefault(cfg.LeftoverAge, DefaultLeftoverAge)
	if cfg.CollectEvery == 0 {
		cfg.CollectEvery = DefaultCollectEvery
	}
	s := &Service{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "templatebuild"),
		files: fileStore{dir: cfg.FilesDir, maxBytes: cfg.MaxUploadBytes},
		slots: make(chan struct{}, cfg.MaxConcurrent),
		now:   time.Now,
	}
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := s.recoverInterrupted(ctx); err != nil {
		s.cancel()
		return nil, err
	}
	if cfg.CollectEvery > 0 {
		s.wg.Add(1)
		go s.collectLoop()
	}
	return s, nil
}

func orDefault[T int | int64 | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// Close cancels the running builds (they end as failed, their sandboxes
// killed) and waits for them.
func (s *Service) Close() error {
	s.cancel()
	s.wg.Wait()
	return nil
}

// interruptedReason is the failure of a build a restart cut short.
const interruptedReason = "interrupted: the server restarted during the build; start the build again"

// recoverInterrupted fails every build a previous process left unfinished;
// no goroutine of this process runs them.
func (s *Service) recoverInterrupted(ctx context.Context) error {
	builds, err := s.cfg.Store.UnfinishedTemplateBuilds(ctx)
	if err != nil {
		return fmt.Errorf("recover template builds: %w", err)
	}
	for _, b := range builds {
		if b.SandboxID != "" {
			if err := s.cfg.Sandboxes.KillSandbox(ctx, b.SandboxID); err != nil {
				s.log.Warn("kill the sandbox of an interrupted build", "build", b.ID, "sandbox", b.SandboxID, "err", err)
			}
			_ = s.cfg.Store.SetTemplateBuildSandbox(ctx, b.ID, "")
		}
		if _, err := s.cfg.Store.FinishTemplateBuild(ctx, b.ID, store.BuildError, reasonJSON(Reason{Message: interruptedReason})); err != nil {
			return fmt.Errorf("recover template build %s: %w", b.ID, err)
		}
		s.log.Info("marked an interrupted template build failed", "build", b.ID, "template", b.Template)
	}
	return nil
}

// Reason is why a build failed, as TemplateBuildInfo.reason.
type Reason struct {
	Message string `json:"message"`
	// Step is "base", "1".."n" (1-based) or "finalize".
	Step string `json:"step,omitempty"`
}

func reasonJSON(r Reason) string {
	b, _ := json.Marshal(r)
	return string(b)
}

func decodeReason(s string) *Reason {
	if s == "" {
		return nil
	}
	var r Reason
	if err := json.Unmarshal([]byte(s), &r); err != nil || r.Message == "" {
		return &Reason{Message: s}
	}
	return &r
}
