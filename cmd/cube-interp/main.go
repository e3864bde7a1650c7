// Command cube-interp is the code-interpreter server of a sandbox: the
// E2B code-interpreter HTTP API on port 49999 over Jupyter kernels
// (internal/interp).
//
//	cube-interp [flags]                serve
//	cube-interp [flags] -- ARGV...     start the server in the background, then exec ARGV
//	cube-interp --supervise [flags]    run the server, restart it when it exits (what the second form starts)
//
// The second form is how a sandbox starts it: the cubelet puts it in front
// of envd's argv, so envd keeps its pid (the one the sandbox's pid 1 waits
// for) and its inherited ready fd, and templates without the code
// interpreter run exactly as before.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/interp"
)

func main() {
	flags, argv := splitArgv(os.Args[1:])
	if argv == nil && len(flags) > 0 && flags[0] == interp.SuperviseFlag {
		log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "cube-interp-supervisor")
		if err := interp.Supervise(log, flags[1:], os.NewFile(3, "ready")); err != nil {
			fmt.Fprintln(os.Stderr, "cube-interp:", err)
			os.Exit(1)
		}
		return // not reached: Supervise returns only errors
	}
	if argv != nil {
		if err := interp.ServeAndExec(flags, argv); err != nil {
			fmt.Fprintln(os.Stderr, "cube-interp:", err)
			os.Exit(1)
		}
		return // not reached: exec replaced this process
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, flags); err != nil {
		fmt.Fprintln(os.Stderr, "cube-interp:", err)
		os.Exit(1)
	}
}

// splitArgv splits args at the first "--": flags before, the argv to exec
// after (nil without "--").
func splitArgv(args []string) (flags, argv []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], append([]string{}, args[i+1:]...)
		}
	}
	return args, nil
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cube-interp", flag.ContinueOnError)
	listen := fs.String("listen", "0.0.0.0:"+strconv.Itoa(interp.Port), "listen address")
	user := fs.String("user", "user", "user the kernels run as (empty: this process's user)")
	cwd := fs.String("cwd", "", "working directory of contexts that name none (default: the user's home)")
	envdURL := fs.String("envd-url", "http://127.0.0.1:49983", "envd: it decides X-Access-Token and holds the sandbox's env vars (empty: no token check, no env vars)")
	runDir := fs.String("run-dir", "", "directory for kernel connection files (default: $TMPDIR)")
	var kernelDirs multiFlag
	fs.Var(&kernelDirs, "kernel-dir", "kernelspec directory (repeatable; default: the system's Jupyter dirs)")
	prewarm := fs.Bool("prewarm", true, "start the default Python kernel at once")
	readyFD := fs.Int("ready-fd", 0, "write a byte to this fd once listening (0: none)")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	it, err := interp.New(interp.Config{KernelDirs: kernelDirs, User: *user, Cwd: *cwd, RunDir: *runDir,
		EnvdURL: *envdURL, Log: log})
	if err != nil {
		return err
	}
	defer it.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	log.Info("code interpreter listening", "addr", ln.Addr().String(), "languages", it.Languages())
	if *readyFD > 2 {
		ready := os.NewFile(uintptr(*readyFD), "ready")
		_, _ = ready.Write([]byte{1})
		_ = ready.Close()
	}
	if *prewarm {
		go func() {
			start := time.Now()
			if err := it.Prewarm(ctx); err != nil {
				log.Warn("start default python kernel", "err", err)
				return
			}
			log.Info("default python kernel ready", "took", time.Since(start).Round(time.Millisecond))
		}()
	}
	srv := &http.Server{Handler: it.Handler(), ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return fmt.Sprint(*m) }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
