package roles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/api"
	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/leader"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/proxy"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
	"github.com/cube-dev/cube/internal/templatedist"
	"github.com/cube-dev/cube/internal/version"
)

// ServerConfig configures `cube server` (cluster mode: api, master, proxy).
type ServerConfig struct {
	Listen  string
	DataDir string
	DB      string // store address: a SQLite path or postgres:// URL; default <data-dir>/server.db
	APIKey  string
	Domain  string
	// Roles to serve: any of api, master, proxy (all by default).
	Roles []string
	// RequireNodeKey refuses cubelets that register without an API key.
	RequireNodeKey bool
	DownAfter      time.Duration
	RateLimits     *api.RateLimits // per-API-key limits; nil = api.DefaultRateLimits
	MetricsListen  string          // address of the Prometheus /metrics listener ("" = none)
	Logger         *slog.Logger
	Out            io.Writer
	// InsecureRegistries (HOST[:PORT]) may be pulled over plain HTTP by
	// template builds fromImage; others only over HTTPS.
	InsecureRegistries []string
}

// nodeStore is what the server's store must offer for cluster mode.
type nodeStore interface {
	store.Store
	cluster.DocumentStore
}

// RunServer runs the control plane against remote cubelets until ctx ends.
func RunServer(ctx context.Context, cfg ServerConfig) error {
	log := cfg.Logger
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if cfg.DB == "" {
		cfg.DB = filepath.Join(cfg.DataDir, "server.db")
	}
	opened, err := store.Open(ctx, cfg.DB)
	if err != nil {
		return err
	}
	defer opened.Close()
	st, ok := opened.(nodeStore)
	if !ok {
		return fmt.Errorf("store %T cannot hold node records", opened)
	}
	key, err := ensureAPIKey(ctx, st, cfg.APIKey, cfg.DataDir)
	if err != nil {
		return err
	}
	// Templates registered on the server (cube template create --data-dir
	// <server data-dir>) are shipped to nodes that lack them.
	templates := template.NewRegistry(cfg.DataDir)
	// code-interpreter-v1 is built here on its first create; templates
	// committed on nodes are shipped from their layers in the store.
	source := newBuiltinSource(ctx, templates, nil, false, nil, log)
	source.TemplateSource = templatedist.Source{Registry: templates, Layers: st}
	reg := cluster.NewRegistry(cluster.Config{
		ServerVersion: version.Version, DownAfter: cfg.DownAfter, Logger: log,
		Templates: source,
		// Templates committed on a node (template builds) are copied into
		// the store as layers, so that any node can run them; the step
		// cache stays where it was made.
		Layers:     st,
		KeepOnNode: func(name string) bool { return strings.HasPrefix(name, templatebuild.CachePrefix) },
	}, cluster.DocumentNodes{Docs: st}, st)
	if err := reg.Load(ctx); err != nil {
		return err
	}
	metrics := newMetricsRegistry()
	if err := errors.Join(reg.RegisterMetrics(metrics), st.RegisterMetrics(metrics)); err != nil {
		return err
	}
	// Background loops (sandbox expiry, node health, drains) run on one replica:
	// the PostgreSQL lock holder, or this process alone on SQLite.
	// Each loop takes its own lock (an advisory lock is per connection).
	var elector, clusterElector leader.Elector = leader.Always{}, leader.Always{}
	if strings.HasPrefix(cfg.DB, "postgres://") || strings.HasPrefix(cfg.DB, "postgresql://") {
		pe, err := leader.NewPostgres(cfg.DB, leader.PostgresConfig{Name: "cube-reaper"})
		if err != nil {
			return err
		}
		ce, err := leader.NewPostgres(cfg.DB, leader.PostgresConfig{Name: "cube-cluster"})
		if err != nil {
			return err
		}
		elector, clusterElector = pe, ce
	}
	m := master.New(st, reg, master.Config{Domain: cfg.Domain, Logger: log.With("role", "cubemaster"), Elector: elector})
	reg.SetLifecycle(m)
	if err := m.Restore(ctx); err != nil {
		return fmt.Errorf("restore sandboxes: %w", err)
	}
	go leader.Run(ctx, clusterElector, func(ctx context.Context) error { return reg.Run(ctx) })
	go reg.SyncLoop(ctx)

	mux := http.NewServeMux()
	var quiet []string // routes logged at debug only
	if hasRole(cfg.Roles, "master") {
		path, h := cluster.NewRegistryHandler(reg, st, cfg.RequireNodeKey)
		mux.Handle(path, h)
		quiet = append(quiet, path) // node heartbeats
		admin := cluster.NewAdminHandler(reg, st)
		cluster.MountAdmin(mux, admin)
		templatedist.Mount(mux, templatedist.NewHandler(templates, st, st))
	}
	if hasRole(cfg.Roles, "api") {
		opts := rateLimitOptions(cfg.RateLimits)
		mo, err := apiMetricsOption(metrics)
		if err != nil {
			return err
		}
		opts = append(opts, mo)
		// Template builds keep their records, logs and uploads in the store,
		// so any replica answers for any build (docs/templates.md).
		builds, err := newTemplateBuilds(ctx, cfg.DataDir, opened, buildSandboxes{m: m, reg: reg},
			clusterTemplates{server: templatebuild.RegistryTemplates{Registry: templates}, records: opened, reg: reg}, templates, opened,
			cfg.InsecureRegistries, metrics, log)
		if err != nil {
			return fmt.Errorf("template builds: %w", err)
		}
		defer builds.Close()
		opts = append(opts, api.WithTemplateBuilds(builds))
		mux.Handle("/", api.New(m, st, log.With("role", "cube-api"), opts...))
	}
	handler, err := apiHandler(mux, metrics, log, quiet...)
	if err != nil {
		return err
	}
	if hasRole(cfg.Roles, "proxy") {
		handler = proxy.New(m, handler, cfg.Domain)
	}
	if err := serveMetrics(ctx, cfg.MetricsListen, metrics, log); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := newHTTPServer(handler, log)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	printWelcome(cfg.Out, ln.Addr().String(), key, cfg.DataDir)
	log.Info("cube server is serving", "listen", ln.Addr().String(), "roles", strings.Join(cfg.Roles, ","), "version", version.Version)
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	return m.Shutdown(sctx, false)
}

func hasRole(roles []string, r string) bool {
	if len(roles) == 0 {
		return true
	}
	for _, x := range roles {
		if x == r {
			return true
		}
	}
	return false
}

// rateLimitOptions configures the API's per-key rate limits (nil: defaults).
func rateLimitOptions(l *api.RateLimits) []api.Option {
	if l == nil {
		return nil
	}
	return []api.Option{api.WithRateLimits(*l)}
}
