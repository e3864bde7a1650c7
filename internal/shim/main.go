package shim

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/errdefs"
)

// Command is the subcommand of the cube binary that runs Main.
const Command = "shim"

// statusFD is the fd on which a starting shim reports to the agent.
const statusFD = 3

// report is one line on the status pipe: first a "hello" with the detached
// shim's pid, then "done" with the outcome.
type report struct {
	Stage   string `json:"stage"`
	PID     int    `json:"pid,omitempty"`
	InitPID int    `json:"initPid,omitempty"`
	Error   string `json:"error,omitempty"`
	Code    int    `json:"code,omitempty"` // errdefs.HTTPStatus of Error
}

// Main is the body of `cube shim --state-dir DIR`; args are the arguments
// after the subcommand. Started by Spawn as the leader of a new session, it
// runs launch, reports the outcome on fd 3, then supervises the workload
// until its init exits. It needs nothing from the agent once started: when
// the agent exits, the shim is re-parented (to the host's init or the
// nearest subreaper) and keeps running.
func Main(args []string, launch Launcher) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	stateDir := fs.String("state-dir", "", "sandbox state directory")
	// Earlier agents started the shim in two stages (the first re-executing
	// itself with --detached); the flag is still accepted and means nothing.
	_ = fs.Bool("detached", false, "ignored (compatibility)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("stateDir", *stateDir)
	status := os.NewFile(statusFD, "status")
	if *stateDir == "" || status == nil {
		log.Error("shim needs --state-dir and a status pipe on fd 3")
		return 2
	}
	if err := supervise(log, *stateDir, status, launch); err != nil {
		log.Error("shim failed", "err", err)
		return 1
	}
	return 0
}

func supervise(log *slog.Logger, stateDir string, status *os.File, launch Launcher) error {
	// Nothing may stop the supervisor but SIGKILL or its sandbox ending;
	// SIGTERM asks it to kill the sandbox.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)

	enc := json.NewEncoder(status)
	if err := enc.Encode(report{Stage: "hello", PID: os.Getpid()}); err != nil {
		return fmt.Errorf("agent went away before the shim started: %w", err)
	}
	fail := func(err error) error {
		_ = enc.Encode(report{Stage: "done", Error: err.Error(), Code: errdefs.HTTPStatus(err)})
		return err
	}
	ctx := context.Background()
	w, err := launch(ctx, stateDir)
	if err != nil {
		return fail(err)
	}
	abort := func(err error) error {
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if kerr := w.Kill(kctx); kerr != nil {
			err = errors.Join(err, kerr)
		}
		w.Wait()
		return fail(err)
	}

	sock := filepath.Join(stateDir, SocketFile)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return abort(fmt.Errorf("listen on %s: %w", sock, err))
	}
	defer os.Remove(sock)
	started := time.Now().UTC()
	srv := newServer(w, State{ShimPID: os.Getpid(), InitPID: w.Pid(), Running: true, StartedAt: started, Version: Version})
	info := Info{Schema: SchemaVersion, PID: os.Getpid(), InitPID: w.Pid(), Version: Version, Socket: sock, StartedAt: started}
	if err := atomicfile.WriteJSON(filepath.Join(stateDir, InfoFile), info, 0o644); err != nil {
		ln.Close()
		return abort(fmt.Errorf("record shim: %w", err))
	}
	if err := enc.Encode(report{Stage: "done", PID: os.Getpid(), InitPID: w.Pid()}); err != nil {
		// The agent gave up waiting: nobody will manage this sandbox.
		ln.Close()
		return abort(fmt.Errorf("agent went away during start: %w", err))
	}
	status.Close()
	log.Info("sandbox started", "shimPid", os.Getpid(), "initPid", w.Pid())

	hs := &http.Server{Handler: srv.handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	exitCh := make(chan ExitStatus, 1)
	go func() { exitCh <- w.Wait() }()
	var exit ExitStatus
	select {
	case exit = <-exitCh:
	case <-term:
		log.Info("SIGTERM: killing sandbox")
		kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := w.Kill(kctx); err != nil {
			log.Error("kill sandbox", "err", err)
		}
		cancel()
		exit = <-exitCh
	}
	exit.Schema = SchemaVersion
	if err := atomicfile.WriteJSON(filepath.Join(stateDir, ExitFile), exit, 0o644); err != nil {
		log.Error("record exit", "err", err)
	}
	srv.markExited(exit)
	log.Info("sandbox exited", "exitCode", exit.ExitCode, "signal", exit.Signal)
	// Kill whatever the init left behind (processes that escaped its pid
	// namespace cannot exist, but the workload decides).
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Kill(kctx); err != nil {
		log.Error("kill leftovers", "err", err)
	}
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	return hs.Shutdown(sctx)
}
