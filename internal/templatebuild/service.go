// Package templatebuild is the control-plane side of E2B's template build
// API: it records builds, stores the files of COPY steps, and runs each
// build's steps inside a Cube sandbox through envd, committing the
// sandbox's filesystem as a template (an intermediate one after each step,
// for the step cache, and the final one under the template's name).
//
// A build: POST /v3/templates (RequestBuild: a build record, "waiting"),
// uploads of the COPY archives (FileLink, PutFile), POST /v2/.../builds/{id}
// (StartBuild: validated, then run by a goroutine), and status polls
// (Status: status and log entries by offset). Builds, logs and uploaded
// files live in the control-plane store, so every replica of the server
// answers for every build. The replica running a build owns it and
// heartbeats its record; any replica fails a build whose owner stopped
// (liveness.go).
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
	"os"
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
	StartTemplateBuild(ctx context.Context, id, owner string) error
	HeartbeatTemplateBuild(ctx context.Context, id, owner string, at time.Time) (bool, error)
	FailStaleTemplateBuild(ctx context.Context, id string, staleBefore time.Time, reason string) (bool, error)
	SetTemplateBuildSandbox(ctx context.Context, id, sandboxID string) error
	FinishTemplateBuild(ctx context.Context, id string, status store.BuildStatus, reason string) (bool, error)
	DeleteTemplateBuilds(ctx context.Context, template string) error
	AppendTemplateBuildLogs(ctx context.Context, buildID string, first int, entries []store.BuildLogEntry) error
	TemplateBuildLogs(ctx context.Context, buildID string, offset, limit int) ([]store.BuildLogEntry, error)
	ListSandboxes(ctx context.Context, f store.ListFilter) (store.Page, error)
	SharedSecret(ctx context.Context, name string, candidate []byte) ([]byte, error)
	// DeleteUnusedLayers removes the stored template layers no record
	// references, unused since olderThan (gc.go).
	DeleteUnusedLayers(ctx context.Context, olderThan time.Time) ([]string, error)
	FileStore
	TagStore // tags.go
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
	// FilesDir spools uploads of COPY archives before they go to the
	// store, usually <data dir>/template-files (where earlier versions
	// kept the uploads; New moves those into the store).
	FilesDir string
	// Secret signs upload URLs. Empty = the store's shared secret
	// UploadSecretName, made once by the first replica.
	Secret []byte
	// Instance names this server among the replicas (stable across its
	// restarts, e.g. host name and data dir); a build is owned by
	// Instance plus a random id of this process. At start, builds owned
	// by an earlier process of the same instance fail at once; builds of
	// other instances only when their owner stops heartbeating.
	// Empty = the host name.
	Instance string
	// HeartbeatEvery is how often the owner of a running build marks it
	// alive and every replica looks for builds whose owner stopped
	// (DefaultHeartbeatEvery); StaleAfter how long without a heartbeat
	// fails a build (DefaultStaleAfter).
	HeartbeatEvery time.Duration
	StaleAfter     time.Duration
	// Clock is the time of heartbeats, staleness, upload URL expiry and
	// collection; nil = time.Now.
	Clock func() time.Time
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
	// Metrics, when set, counts builds, steps and uploads (metrics.go).
	Metrics *Metrics
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
	// owner is this process among the replicas (Instance#random).
	owner string

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// gcMu is held shared by every running build and exclusively by the
	// collector, which skips a round while builds run.
	gcMu sync.RWMutex
}

// New returns a build service. It fails at once the builds an earlier
// process of this instance left building (killing their build sandboxes),
// and from then on, every HeartbeatEvery, the builds of any replica whose
// owner stopped heartbeating.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Sandboxes == nil || cfg.Templates == nil || cfg.FilesDir == "" {
		return nil, errors.New("templatebuild: Store, Sandboxes, Templates and FilesDir are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.Secret) == 0 {
		candidate := make([]byte, 32)
		_, _ = rand.Read(candidate)
		secret, err := cfg.Store.SharedSecret(ctx, UploadSecretName, candidate)
		if err != nil {
			return nil, fmt.Errorf("template builds: upload URL key: %w", err)
		}
		cfg.Secret = secret
	}
	if cfg.Instance == "" {
		cfg.Instance, _ = os.Hostname()
	}
	cfg.HeartbeatEvery = orDefault(cfg.HeartbeatEvery, DefaultHeartbeatEvery)
	cfg.StaleAfter = orDefault(cfg.StaleAfter, DefaultStaleAfter)
	if cfg.Clock == nil {
		cfg.Clock = time.Now
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
		files: fileStore{st: cfg.Store, dir: cfg.FilesDir, maxBytes: cfg.MaxUploadBytes},
		slots: make(chan struct{}, cfg.MaxConcurrent),
		now:   cfg.Clock,
		owner: cfg.Instance + "#" + newUUID()[:8],
	}
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := s.files.importLocal(ctx); err != nil {
		s.log.Warn("move uploads of an earlier version into the store", "dir", cfg.FilesDir, "err", err)
	}
	if err := s.failStale(ctx); err != nil {
		s.cancel()
		return nil, err
	}
	s.every(s.cfg.HeartbeatEvery, s.failStaleOnce)
	if cfg.CollectEvery > 0 {
		s.every(cfg.CollectEvery, s.collectOnce)
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
