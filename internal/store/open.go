package store

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Store is everything the server needs from the control-plane store:
// sandbox records (master.Store), API keys (api.KeyVerifier and key
// management), node documents (cluster), template builds and their logs
// (templatebuild), layers and template records (cluster, templatedist) and
// the schema version. SQLite and PostgreSQL implement it.
type Store interface {
	CreateSandbox(ctx context.Context, sb Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	SetEndAt(ctx context.Context, id string, endAt time.Time) error
	SetState(ctx context.Context, id string, state State, endAt time.Time) error
	SetNetwork(ctx context.Context, id string, network json.RawMessage, allowInternet *bool) error
	ListSandboxes(ctx context.Context, f ListFilter) (Page, error)
	ExpiredSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error)
	NextEndAt(ctx context.Context, after time.Time) (time.Time, bool, error)
	AllSandboxes(ctx context.Context) ([]Sandbox, error)

	CreateKey(ctx context.Context, name string) (string, error)
	AddKeyHash(ctx context.Context, name, plaintext string) (string, error)
	ListKeys(ctx context.Context) ([]APIKey, error)
	RevokeKey(ctx context.Context, id string) error
	VerifyKey(ctx context.Context, plaintext string) (string, error)

	PutNodeData(ctx context.Context, id string, data []byte) error
	DeleteNodeData(ctx context.Context, id string) error
	SetNodeProgress(ctx context.Context, id string, progress []byte) error
	ListNodeData(ctx context.Context) (map[string]NodeData, error)

	CreateTemplateBuild(ctx context.Context, b TemplateBuild) error
	GetTemplateBuild(ctx context.Context, id string) (TemplateBuild, error)
	ListTemplateBuilds(ctx context.Context, template string) ([]TemplateBuild, error)
	UnfinishedTemplateBuilds(ctx context.Context) ([]TemplateBuild, error)
	StartTemplateBuild(ctx context.Context, id, owner string) error
	HeartbeatTemplateBuild(ctx context.Context, id, owner string, at time.Time) (bool, error)
	FailStaleTemplateBuild(ctx context.Context, id string, staleBefore time.Time, reason string) (bool, error)
	SetTemplateBuildSandbox(ctx context.Context, id, sandboxID string) error
	FinishTemplateBuild(ctx context.Context, id string, status BuildStatus, reason string) (bool, error)
	DeleteTemplateBuilds(ctx context.Context, template string) error
	AppendTemplateBuildLogs(ctx context.Context, buildID string, first int, entries []BuildLogEntry) error
	TemplateBuildLogs(ctx context.Context, buildID string, offset, limit int) ([]BuildLogEntry, error)
	TemplateBuildLogCount(ctx context.Context, buildID string) (int, error)
	PutTemplateFile(ctx context.Context, hash string, r io.Reader) (bool, error)
	TouchTemplateFile(ctx context.Context, hash string) (bool, error)
	OpenTemplateFile(ctx context.Context, hash string) (io.ReadCloser, error)
	DeleteUnusedTemplateFiles(ctx context.Context, usedBefore, orphansBefore time.Time) ([]string, error)
	SharedSecret(ctx context.Context, name string, candidate []byte) ([]byte, error)
	// Template tags (tags.go).
	SetTemplateBuildTags(ctx context.Context, buildID string, tags []string) error
	TemplateBuildTags(ctx context.Context, buildID string) ([]string, error)
	GetTemplateTag(ctx context.Context, template, tag string) (TemplateTag, error)
	ListTemplateTags(ctx context.Context, template string) ([]TemplateTag, error)
	TemplateTagsOf(ctx context.Context, target string) ([]TemplateTag, error)
	PutTemplateTags(ctx context.Context, template string, tags []string, buildID, target string) ([]TemplateTag, error)
	RemoveTemplateTags(ctx context.Context, template string, tags []string) ([]TemplateTag, error)
	DeleteTemplateTags(ctx context.Context, template string) error
	// Layers and template records (layers.go, templaterecords.go).
	PutLayer(ctx context.Context, digest string, r io.Reader) (stored bool, err error)
	OpenLayer(ctx context.Context, digest string) (io.ReadCloser, int64, error)
	HasLayer(ctx context.Context, digest string) (bool, error)
	PutTemplateRecord(ctx context.Context, rec TemplateRecord) error
	GetTemplateRecord(ctx context.Context, name string) (TemplateRecord, error)
	ListTemplateRecords(ctx context.Context) ([]TemplateRecord, error)
	DeleteTemplateRecord(ctx context.Context, name string) error
	DeleteUnusedLayers(ctx context.Context, olderThan time.Time) ([]string, error)

	SchemaVersion(ctx context.Context) (int, error)
	// RegisterMetrics registers the store's query metrics (metrics.go).
	RegisterMetrics(reg prometheus.Registerer) error
	Close() error
}

var (
	_ Store = (*SQLite)(nil)
	_ Store = (*PostgreSQL)(nil)
)

var schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// Open opens the store named by dsn:
//   - postgres://... or postgresql://... : PostgreSQL (the database must exist)
//   - sqlite://PATH or a plain file path: SQLite at PATH (created if missing)
//
// Any other URL scheme is ErrInvalidArgument.
func Open(ctx context.Context, dsn string) (Store, error) {
	switch {
	case dsn == "":
		return nil, fmt.Errorf("open store: %w: empty database address; give a file path or a postgres:// URL", errdefs.ErrInvalidArgument)
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return OpenPostgreSQL(ctx, dsn)
	case strings.HasPrefix(dsn, "sqlite://"):
		path := strings.TrimPrefix(dsn, "sqlite://")
		if path == "" {
			return nil, fmt.Errorf("open store: %w: sqlite:// needs a path (sqlite:///var/lib/cube/server.db)", errdefs.ErrInvalidArgument)
		}
		return OpenSQLite(ctx, path)
	case schemeRE.MatchString(dsn):
		scheme, _, _ := strings.Cut(dsn, "://")
		return nil, fmt.Errorf("open store: %w: unsupported database scheme %q; use postgres:// or a SQLite file path", errdefs.ErrInvalidArgument, scheme)
	default:
		return OpenSQLite(ctx, dsn)
	}
}
