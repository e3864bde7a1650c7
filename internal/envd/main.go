package envd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/envd/reaper"
	"github.com/cube-dev/cube/internal/residency"
)

// shutdownTimeout bounds a graceful stop.
const shutdownTimeout = 5 * time.Second

// options are envd's command-line flags.
type options struct {
	addr       string
	configFile string
	readyFD    int
	logPipe    string
}

// Main runs envd with command-line args (without the program name) and
// returns the process exit code.
func Main(args []string) int {
	fset := flag.NewFlagSet("envd", flag.ContinueOnError)
	var opts options
	fset.StringVar(&opts.addr, "addr", DefaultAddr, "listen address")
	fset.StringVar(&opts.configFile, "config", DefaultConfigFile, "JSON config file (missing = defaults)")
	fset.IntVar(&opts.readyFD, "ready-fd", 0, "file descriptor (>2) to write one byte to and close once listening")
	fset.StringVar(&opts.logPipe, "log-pipe", LogPipe, "FIFO to write log lines (JSON) into for the node, when it exists")
	version := fset.Bool("version", false, "print the version and exit")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Println(Version)
		return 0
	}
	if opts.readyFD != 0 && opts.readyFD < 3 {
		fmt.Fprintln(os.Stderr, "envd: --ready-fd must be 3 or higher")
		return 2
	}
	if reaper.Needed() {
		logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "envd")
		if pid, ok := reaper.Adopted(); ok {
			code, err := reaper.Adopt(pid)
			if err != nil {
				logger.Error("pid 1 reaper failed", "err", err)
			}
			return code
		}
		code, err := reaper.Run(args, opts.readyFD)
		if err != nil {
			logger.Error("pid 1 reaper failed", "err", err)
		}
		return code
	}
	restoreProcs := startupProcs()
	logger := newLogger(opts.logPipe)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, logger, opts, restoreProcs); err != nil {
		logger.Error("envd stopped", "err", err)
		return 1
	}
	return 0
}

// run serves until ctx ends; restoreProcs, when not nil, is called with the
// start-up pages' drop (startupProcs).
func run(ctx context.Context, logger *slog.Logger, opts options, restoreProcs func()) error {
	cfg, err := LoadConfig(opts.configFile)
	if err != nil {
		return err
	}
	ln, err := listen(ctx, opts.addr)
	if err != nil {
		return err
	}
	// Ready as soon as it listens: a connection made meanwhile waits in the
	// backlog until Serve below, and a cold create no longer waits for the
	// handlers to be built.
	if opts.readyFD > 0 {
		if err := signalReady(opts.readyFD); err != nil {
			_ = ln.Close()
			return err
		}
	}
	srv := NewServer(cfg)
	srv.SetLogger(logger)
	logger.Info("envd listening", "addr", ln.Addr().String(), "version", Version)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		Protocols:         &protocols,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	// Start-up code stays mapped otherwise (most of the binary, see
	// residency); by now a warm-pool slot's readiness probe or a cold
	// create's /init has been served.
	dropStartup := time.AfterFunc(startupPagesDelay, func() {
		if restoreProcs != nil {
			restoreProcs()
		}
		if _, err := residency.DropExecutablePages(); err != nil {
			logger.Debug("drop start-up pages", "err", err)
		}
	})
	defer dropStartup.Stop()
	select {
	case err := <-errc:
		_ = srv.Close(context.Background())
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Info("envd shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	// Streams of running processes only end with their processes: kill
	// those first, then drain connections.
	cerr := srv.Close(sctx)
	serr := hs.Shutdown(sctx)
	if errors.Is(serr, context.DeadlineExceeded) {
		serr = hs.Close()
	}
	return errors.Join(cerr, serr)
}

// listen listens on addr with plain TCP. Go listens with MPTCP by default
// (since 1.24) where the kernel has it: that cost envd's start ~0.4 ms of
// CPU (a probe socket, then the MPTCP socket), and every client of envd
// speaks TCP, which an MPTCP listener only accepts as a fallback.
func listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// startupPagesDelay is how long after it starts serving envd unmaps the
// pages of its binary it has touched so far (and leaves StartupProcsEnv's
// one P).
const startupPagesDelay = 2 * time.Second

// signalReady writes one byte to fd and closes it.
func signalReady(fd int) error {
	f := os.NewFile(uintptr(fd), "ready-fd")
	if f == nil {
		return fmt.Errorf("ready fd %d is not valid", fd)
	}
	defer f.Close()
	if _, err := io.WriteString(f, "1"); err != nil {
		return fmt.Errorf("write ready fd %d: %w", fd, err)
	}
	return nil
}
