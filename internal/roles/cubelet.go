package roles

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/api/gen/node/v1/nodev1connect"
	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/envd"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
	"github.com/cube-dev/cube/internal/version"
)

// CubeletConfig configures `cube cubelet`, the node agent in cluster mode.
type CubeletConfig struct {
	ServerURLs        []string // server replicas serving RegistryService, tried in order
	APIKey            string   // presented at registration (optional unless the server requires it)
	NodeID            string
	Listen            string // CubeletService listener
	PrepDir           string // `cube prep` records reported as preflight health (default <DataDir>/prep)
	AdvertiseIP       string // address the server reaches this node's RPC on (and its host ports, unless DataIP is set)
	DataIP            string // address on which the node's host ports (sandbox traffic) are reached; default AdvertiseIP
	DataDir           string
	RunDir            string
	CgroupParent      string
	EnvdPath          string
	Exe               string
	BuildBase         bool                 // build the `base` template if missing
	PoolSize          int                  // warm-pool slots (cubelet.PoolAdaptive = by demand)
	PoolMemoryMB      int64                // the adaptive pool's budget
	PoolFloor         int                  // the adaptive pool's idle size
	PoolPrestart      bool                 // slots are pre-started sandboxes of template base
	PoolTemplates     []cubelet.PoolTarget // pre-started slots of other templates (cubelet.Config.PoolTemplates)
	SandboxLogs       cubelet.LogConfig    // bounds of the kept sandbox logs (cubelet.Config.Logs)
	CreateParallelism int                  // creates run at once, the rest wait in order (see cubelet.Config.CreateParallelism)
	UserNS            nsrt.UserNSMode      // sandbox user namespaces: auto ("" too), on, off
	SeccompLog        bool                 // log refused syscalls with the sandbox id (cubelet.Config.SeccompLog)
	HostMountNS       string               // mount namespace shims start in: auto ("" too), off or a path (see cubelet.Config)
	Capacity          *nodev1.Capacity
	MetricsListen     string // address of the Prometheus /metrics listener ("" = none)
	Network           cubevs.Config
	Logger            *slog.Logger
}

// RunCubelet runs the node agent: it reconciles the node, serves
// CubeletService, registers with the server and heartbeats until ctx ends.
// Stopping it never stops sandboxes.
func RunCubelet(ctx context.Context, cfg CubeletConfig) error {
	log := cfg.Logger
	if cfg.DataIP != "" && net.ParseIP(cfg.DataIP) == nil {
		return fmt.Errorf("--data-ip %q is not an IP address: %w", cfg.DataIP, errdefs.ErrInvalidArgument)
	}
	templates := template.NewRegistry(cfg.DataDir)
	if cfg.BuildBase {
		if _, err := templates.EnsureBase(ctx, nil); err != nil {
			return fmt.Errorf("default template base: %w", err)
		}
	}
	cfg.Network.RunDir = cfg.RunDir
	// Built-in templates are built on this node from their recipes, in
	// build sandboxes of this node (which exists only after New).
	var started atomic.Pointer[cubelet.Cubelet]
	builds := newNodeSandboxes(started.Load)
	fetcher := nodeFetcher(ctx, templates, &templatedist.Fetcher{BaseURLs: cfg.ServerURLs, APIKey: cfg.APIKey, Logger: log}, builds, log)
	node, err := cubelet.New(ctx, cubelet.Config{
		StateDir: filepath.Join(cfg.DataDir, "node"), Exe: cfg.Exe, EnvdPath: cfg.EnvdPath, EnvdVersion: envd.Version,
		CgroupParent: cfg.CgroupParent, Network: cfg.Network, Logger: log, PoolSize: cfg.PoolSize, PoolMemoryMB: cfg.PoolMemoryMB, PoolFloor: cfg.PoolFloor, PoolPrestart: cfg.PoolPrestart,
		PoolTemplates:     cfg.PoolTemplates,
		CreateParallelism: cfg.CreateParallelism,
		UserNS:            cfg.UserNS,
		SeccompLog:        cfg.SeccompLog,
		HostMountNS:       cfg.HostMountNS,
		Fetcher:           fetcher,
		Logs:              cfg.SandboxLogs,
	}, templates)
	if err != nil {
		return fmt.Errorf("start cubelet: %w", err)
	}
	defer node.Close()
	defer builds.drain(time.Minute) // before Close: ctx's end stops the recipe builds
	started.Store(node)
	fetcher.rebuildStale(ctx, templates)
	metrics := newMetricsRegistry()
	if err := node.RegisterMetrics(metrics); err != nil {
		return err
	}
	if err := serveMetrics(ctx, cfg.MetricsListen, metrics, log); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	if cfg.AdvertiseIP == "" {
		if cfg.AdvertiseIP, err = advertiseIP(ln.Addr()); err != nil {
			return err
		}
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	token := randomToken()
	if cfg.PrepDir == "" {
		cfg.PrepDir = filepath.Join(cfg.DataDir, "prep")
	}
	check := newListenerCheck(ln.Addr(), token, cfg.PrepDir, log)
	ident := nodeIdentity{ID: cfg.NodeID, RPCURL: "http://" + net.JoinHostPort(cfg.AdvertiseIP, port),
		DataIP: cmp.Or(cfg.DataIP, cfg.AdvertiseIP), Token: token, Capacity: cfg.Capacity}
	info := ident.infoFunc(templates, check)
	mux := http.NewServeMux()
	path, h := nodeapi.NewCubeletHandler(node, info, token)
	mux.Handle(path, h)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	link := &serverLink{}
	mux.Handle("GET /readyz", link)
	srv := newHTTPServer(mux, log)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("cubelet serving", "listen", ln.Addr().String(), "node", cfg.NodeID, "advertise", cfg.AdvertiseIP)

	hc := &http.Client{Timeout: 10 * time.Second}
	hb := heartbeater{nodeID: cfg.NodeID, node: node, info: info, check: check, log: log, link: link, builds: builds,
		usage: &usageSampler{parent: cfg.CgroupParent}}
	for _, u := range cfg.ServerURLs {
		hb.servers = append(hb.servers, u)
		hb.clients = append(hb.clients, nodev1connect.NewRegistryServiceClient(hc, u, connect.WithInterceptors(apiKeyInterceptor(cfg.APIKey))))
	}
	go hb.run(ctx)
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	log.Info("cubelet stopped; sandboxes keep running")
	return nil
}

// nodeIdentity is what a node registers as.
type nodeIdentity struct {
	ID       string
	RPCURL   string // where the server reaches CubeletService
	DataIP   string // where the server reaches the node's host ports
	Token    string // bearer token the node's CubeletService accepts
	Capacity *nodev1.Capacity
}

// infoFunc reports the node's identity with its current templates and
// the last self-check.
func (id nodeIdentity) infoFunc(templates *template.Registry, check *selfCheck) nodeapi.InfoFunc {
	return func(ctx context.Context) (*nodev1.NodeInfo, error) {
		ts, err := templates.List(ctx)
		if err != nil {
			return nil, err
		}
		return &nodev1.NodeInfo{
			NodeId: id.ID, Version: version.Version, RpcUrl: id.RPCURL, DataIp: id.DataIP,
			Capacity: id.Capacity, Templates: templatesToProto(ts), Token: id.Token, Health: check.current(),
		}, nil
	}
}

func templatesToProto(ts []template.Template) []*nodev1.Template {
	out := make([]*nodev1.Template, 0, len(ts))
	for _, t := range ts {
		d, err := t.DefaultsJSON()
		if err != nil {
			continue // cannot happen for a template.json that loaded
		}
		out = append(out, &nodev1.Template{Name: t.Name, Digest: t.Digest, CpuCount: int32(t.CPUCount),
			MemoryMb: int32(t.MemoryMB), DiskSizeMb: int32(t.DiskSizeMB), Layers: cubelet.LayerDigests(t), DefaultsJson: d})
	}
	return out
}

func apiKeyInterceptor(key string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if key != "" {
				req.Header().Set("X-API-Key", key)
			}
			return next(ctx, req)
		}
	}
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// advertiseIP picks the address to advertise: the listen address when it is
// specific, else the first non-loopback IPv4 address of the host.
func advertiseIP(addr net.Addr) (string, error) {
	if ta, ok := addr.(*net.TCPAddr); ok && !ta.IP.IsUnspecified() {
		return ta.IP.String(), nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String(), nil
		}
	}
	return "", errors.New("no address to advertise: pass --advertise-ip")
}
