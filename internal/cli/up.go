package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cube-dev/cube/internal/app"
	"github.com/cube-dev/cube/internal/cubevs"
)

func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("up", stderr)
	cfg := app.AllInOneConfig{Out: stdout, Network: cubevs.DefaultConfig()}
	fs.StringVar(&cfg.Listen, "listen", envDefault("CUBE_LISTEN", "127.0.0.1:3000"), "address for the API and sandbox traffic (env CUBE_LISTEN)")
	fs.StringVar(&cfg.DataDir, "data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory (env CUBE_DATA_DIR)")
	fs.StringVar(&cfg.RunDir, "run-dir", envDefault("CUBE_RUN_DIR", "/run/cube"), "runtime directory for kernel anchors such as netns pins (env CUBE_RUN_DIR)")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("CUBE_API_KEY"), "API key to accept (env CUBE_API_KEY); default: generate one on first start")
	fs.StringVar(&cfg.Domain, "domain", envDefault("CUBE_DOMAIN", ""), "domain for <port>-<id>.<domain> sandbox hosts (env CUBE_DOMAIN)")
	fs.BoolVar(&cfg.KeepSandboxes, "keep-sandboxes", false, "leave sandboxes running when Cube stops")
	fs.StringVar(&cfg.EnvdPath, "envd", envDefault("CUBE_ENVD", ""), "path of the envd binary (default: next to the cube binary)")
	nodeCIDR := fs.String("node-cidr", envDefault("CUBE_NODE_CIDR", cfg.Network.NodeCIDR.String()), "sandbox address range of this node")
	logLevel := fs.String("log-level", envDefault("CUBE_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %v", fs.Args())}
	}
	p, err := netip.ParsePrefix(*nodeCIDR)
	if err != nil {
		return usageError{fmt.Sprintf("--node-cidr: %v", err)}
	}
	cfg.Network.NodeCIDR = p
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Exe = exe
	if cfg.EnvdPath == "" {
		cfg.EnvdPath = filepath.Join(filepath.Dir(exe), "envd")
	}
	cfg.Logger = newLogger(stderr, *logLevel)
	return app.RunAllInOne(ctx, cfg)
}

func runDown(_ context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("down", stderr)
	dataDir := fs.String("data-dir", envDefault("CUBE_DATA_DIR", "/var/lib/cube"), "data directory of the Cube to stop")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for it to stop")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return app.StopAllInOne(*dataDir, *timeout)
}

var _ = flag.ErrHelp
