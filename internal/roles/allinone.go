// Package roles composes Cube's components into runnable roles: `cube
// server` (api, master, proxy and the node registry), `cube cubelet` (the
// node agent, registering with servers over HTTP) and `cube up`
// (all-in-one). All-in-one is the two in one process: the registry reaches
// its node through the same CubeletService handler in-process (no network
// hop) and the node registers through the same RegistryService, so a
// create takes the same path (registry, scheduler, node API) in both modes.
package roles

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/api/gen/node/v1/nodev1connect"
	"github.com/cube-dev/cube/internal/api"
	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/envd"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/proxy"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
	"github.com/cube-dev/cube/internal/version"
)

// AllInOneConfig configures `cube up`.
type AllInOneConfig struct {
	Listen            string
	DataDir           string
	RunDir            string
	APIKey            string // empty: use the stored keys, or generate one on first start
	Domain            string
	KeepSandboxes     bool
	EnvdPath          string
	Exe               string
	CgroupParent      string               // sandbox cgroups go under it, shims under <parent>-shims; "" = "cube"
	PoolSize          int                  // warm-pool slots kept ready (0 = every create is cold, cubelet.PoolAdaptive = by demand)
	PoolMemoryMB      int64                // the adaptive pool's budget (cubelet.Config.PoolMemoryMB)
	PoolFloor         int                  // the adaptive pool's idle size (cubelet.Config.PoolFloor)
	PoolPrestart      bool                 // slots are pre-started sandboxes of template base (see cubelet.Config.PoolPrestart)
	PoolTemplates     []cubelet.PoolTarget // pre-started slots of other templates (cubelet.Config.PoolTemplates)
	SandboxLogs       cubelet.LogConfig    // bounds of the kept sandbox logs (cubelet.Config.Logs)
	CreateParallelism int                  // creates run at once, the rest wait in order (see cubelet.Config.CreateParallelism)
	UserNS            nsrt.UserNSMode      // sandbox user namespaces: auto ("" too), on, off
	SeccompLog        bool                 // log refused syscalls with the sandbox id (cubelet.Config.SeccompLog)
	HostMountNS       string               // mount namespace shims start in: auto ("" too), off or a path (see cubelet.Config)
	RateLimits        *api.RateLimits      // per-API-key limits; nil = api.DefaultRateLimits
	MetricsListen     string               // address of the Prometheus /metrics listener ("" = none)
	Capacity          *nodev1.Capacity     // what the scheduler may place on the node (as a cubelet's); nil = no limits
	Network           cubevs.Config
	Logger            *slog.Logger
	Out               io.Writer // user-facing output (progress, exports)
	// PrebuildInterp builds the built-in template code-interpreter-v1 in
	// the background after start; without it, its first create builds it.
	PrebuildInterp bool
	// InsecureRegistries (HOST[:PORT]) may be pulled over plain HTTP by
	// template builds fromImage; others only over HTTPS.
	InsecureRegistries []string
}

// LocalNodeID is the node id of an all-in-one Cube's in-process node.
const LocalNodeID = "local"

// RunAllInOne starts server and cubelet on this machine and blocks until ctx
// is cancelled, then shuts down cleanly.
func RunAllInOne(ctx context.Context, cfg AllInOneConfig) error {
	log := cfg.Logger
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	release, err := lockPIDFile(filepath.Join(cfg.DataDir, "cube.pid"))
	if err != nil {
		return err
	}
	defer release()

	templates := template.NewRegistry(cfg.DataDir)
	if _, err := templates.Get(ctx, "base"); err != nil {
		fmt.Fprintln(cfg.Out, "cube: building default template \"base\" (first start only; cached afterwards)")
	}
	if _, err := templates.EnsureBase(ctx, cfg.Out); err != nil {
		return fmt.Errorf("default template base: %w", err)
	}

	cfg.Network.RunDir = cfg.RunDir
	// The master is built after the node; sandboxes the node finds dead are
	// forgotten by it once it exists.
	var lifecycle atomic.Pointer[master.Master]
	node, err := cubelet.New(ctx, cubelet.Config{
		OnDead: func(id string) {
			if m := lifecycle.Load(); m != nil {
				if err := m.Forget(context.Background(), id); err != nil {
					log.Warn("forget dead sandbox", "sandbox", id, "err", err)
				}
			}
		},
		StateDir:          filepath.Join(cfg.DataDir, "node"),
		Exe:               cfg.Exe,
		EnvdPath:          cfg.EnvdPath,
		EnvdVersion:       envd.Version,
		CgroupParent:      cfg.CgroupParent,
		PoolSize:          cfg.PoolSize,
		PoolMemoryMB:      cfg.PoolMemoryMB,
		PoolFloor:         cfg.PoolFloor,
		CreateParallelism: cfg.CreateParallelism,
		UserNS:            cfg.UserNS,
		SeccompLog:        cfg.SeccompLog,
		HostMountNS:       cfg.HostMountNS,
		PoolPrestart:      cfg.PoolPrestart,
		PoolTemplates:     cfg.PoolTemplates,
		Network:           cfg.Network,
		Logs:              cfg.SandboxLogs,
		Logger:            log.With("role", "cubelet"),
	}, templates)
	if err != nil {
		return fmt.Errorf("start cubelet: %w", err)
	}
	defer node.Close()

	st, err := store.OpenSQLite(ctx, filepath.Join(cfg.DataDir, "server.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	key, err := ensureAPIKey(ctx, st, cfg.APIKey, cfg.DataDir)
	if err != nil {
		return err
	}
	if n, err := st.PlaceUnplaced(ctx, LocalNodeID); err != nil {
		return err
	} else if n > 0 {
		log.Info("sandboxes recorded before all-in-one scheduled through the registry now belong to its node", "node", LocalNodeID, "sandboxes", n)
	}

	// The node is reached in-process through the same CubeletService
	// handler a remote server calls over HTTP, and registers and
	// heartbeats through the same RegistryService: creates take the
	// cluster's path (registry, scheduler, node API).
	var check *selfCheck
	// Built-in templates are built on the node from their recipes.
	recipes := newNodeSandboxes(func() *cubelet.Cubelet { return node })
	defer recipes.drain(time.Minute) // before node.Close: ctx's end stops the recipe builds
	// The registry requires a token of every node; nothing checks this one
	// (there is no listener to present it to).
	ident := nodeIdentity{ID: LocalNodeID, RPCURL: "in-process", DataIP: node.DataIP().String(), Token: randomToken(),
		// The same limits a cubelet takes (cli's capacity flags; nil: none
		// but the node's own gates: create parallelism, addresses, ports).
		Capacity: cmp.Or(cfg.Capacity, &nodev1.Capacity{})}
	info := func(ctx context.Context) (*nodev1.NodeInfo, error) { return ident.infoFunc(templates, check)(ctx) }
	local := nodeapi.NewInProcessClient(node, info)
	check = newSelfCheck("in-process", local, filepath.Join(cfg.DataDir, "prep"), log.With("role", "cubelet"))
	reg := cluster.NewRegistry(cluster.Config{
		ServerVersion: version.Version, Logger: log,
		Templates: newBuiltinSource(ctx, templates, recipes, cfg.PrebuildInterp, cfg.Out, log),
		Connect: func(rec cluster.NodeRecord) *nodeapi.Client {
			if rec.ID == LocalNodeID {
				return local
			}
			return nodeapi.NewClient(http.DefaultClient, rec.RPCURL, rec.Token)
		},
	}, cluster.DocumentNodes{Docs: st}, st)
	if err := reg.Load(ctx); err != nil {
		return err
	}
	metrics := newMetricsRegistry()
	if err := errors.Join(node.RegisterMetrics(metrics), reg.RegisterMetrics(metrics), st.RegisterMetrics(metrics)); err != nil {
		return err
	}
	m := master.New(st, reg, master.Config{Domain: cfg.Domain, Logger: log.With("role", "cubemaster")})
	reg.SetLifecycle(m)
	lifecycle.Store(m)
	if err := m.Restore(ctx); err != nil {
		return fmt.Errorf("restore sandboxes: %w", err)
	}
	go reg.Run(ctx)
	go reg.SyncLoop(ctx)
	registered := make(chan struct{})
	go heartbeater{nodeID: LocalNodeID, servers: []string{"in-process"},
		clients: []nodev1connect.RegistryServiceClient{cluster.NewRegistryService(reg)},
		node:    node, info: info, check: check, log: log.With("role", "cubelet"), registered: registered, builds: recipes,
		usage: &usageSampler{parent: cfg.CgroupParent},
	}.run(ctx)
	select {
	case <-registered:
	case <-ctx.Done():
		return ctx.Err()
	}

	mux := http.NewServeMux()
	admin := cluster.NewAdminHandler(reg, st)
	cluster.MountAdmin(mux, admin)
	builds, err := newTemplateBuilds(ctx, cfg.DataDir, st, buildSandboxes{m: m, reg: reg, dial: node.DialContext},
		templatebuild.RegistryTemplates{Registry: templates}, templates, nil, cfg.InsecureRegistries, metrics, log)
	if err != nil {
		return fmt.Errorf("template builds: %w", err)
	}
	defer builds.Close()
	mo, err := apiMetricsOption(metrics)
	if err != nil {
		return err
	}
	opts := append(rateLimitOptions(cfg.RateLimits), api.WithTemplateBuilds(builds), mo)
	mux.Handle("/", api.New(m, st, log.With("role", "cube-api"), opts...))
	logged, err := apiHandler(mux, metrics, log)
	if err != nil {
		return err
	}
	handler := proxy.New(m, logged, cfg.Domain)
	// Sandbox addresses are routed in the host netns, which need not be ours.
	handler.SetDialer(node.DialContext)

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if err := serveMetrics(ctx, cfg.MetricsListen, metrics, log); err != nil {
		ln.Close()
		return err
	}
	srv := newHTTPServer(handler, log)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	printWelcome(cfg.Out, ln.Addr().String(), key, cfg.DataDir)
	log.Info("cube is serving", "listen", ln.Addr().String(), "dataDir", cfg.DataDir)

	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	log.Info("shutting down", "keepSandboxes", cfg.KeepSandboxes)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	var errs []error
	if err := m.Shutdown(sctx, !cfg.KeepSandboxes); err != nil {
		errs = append(errs, err)
	}
	if !cfg.KeepSandboxes {
		// Nothing is left to serve: remove the dataplane too, so a stopped
		// Cube leaves no link, nft table or netns pin on the host.
		if err := node.KillAll(sctx); err != nil {
			errs = append(errs, err)
		} else if err := node.DestroyNetwork(sctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Protocols = &p
	return srv
}

// ensureAPIKey makes sure a usable API key exists and returns the one to
// print (empty when keys already existed and none was given).
func ensureAPIKey(ctx context.Context, st store.Store, given, dataDir string) (string, error) {
	if given != "" {
		if _, err := st.AddKeyHash(ctx, "cli", given); err != nil {
			return "", fmt.Errorf("register api key: %w", err)
		}
		return given, nil
	}
	keys, err := st.ListKeys(ctx)
	if err != nil {
		return "", err
	}
	for _, k := range keys {
		if k.RevokedAt == nil {
			if b, err := os.ReadFile(filepath.Join(dataDir, "api-key")); err == nil {
				return string(trimNL(b)), nil
			}
			return "", nil
		}
	}
	key, err := st.CreateKey(ctx, "default")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dataDir, "api-key"), []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write api key file: %w", err)
	}
	return key, nil
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

func printWelcome(w io.Writer, addr, key, dataDir string) {
	url := "http://" + addr
	fmt.Fprintf(w, "\nCube is running: API and sandbox traffic on %s\n\n", url)
	fmt.Fprintf(w, "Use it with the official E2B SDK:\n\n")
	fmt.Fprintf(w, "export E2B_API_URL=%s\nexport E2B_SANDBOX_URL=%s\n", url, url)
	if key != "" {
		fmt.Fprintf(w, "export E2B_API_KEY=%s\n\n", key)
	} else {
		fmt.Fprintf(w, "export E2B_API_KEY=<your key>   # keys are stored hashed; create one with `cube key create`\n\n")
	}
	fmt.Fprintf(w, "Data dir: %s. Stop with Ctrl-C or `cube down --data-dir %s`.\n", dataDir, dataDir)
}

// lockPIDFile records this process in path and refuses to start a second
// `cube up` on the same data dir.
func lockPIDFile(path string) (func(), error) {
	if b, err := os.ReadFile(path); err == nil {
		if pid, err := strconv.Atoi(string(trimNL(b))); err == nil && processAlive(pid) {
			return nil, fmt.Errorf("cube is already running on this data dir (pid %d); stop it with `cube down`", pid)
		}
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("write pid file: %w", err)
	}
	return func() { os.Remove(path) }, nil
}
