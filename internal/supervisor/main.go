// Package supervisor is the part of a sandbox's shim that lives as long as
// the sandbox: it owns the sandbox's init (its child), serves the shim API
// on a unix socket in the state dir, records how the init ended and kills
// what it left. The shim's start-up stage (package shim, with the runtime
// that builds the sandbox) execs it once the sandbox is ready, on the same
// pid, so the init stays its child.
//
// Every sandbox pays for this process for its whole life, so the package
// imports only the standard library's core, x/sys/unix and small Cube
// packages: no net/http, no eBPF, no crypto. TestStaysSmall guards that.
package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/cgroup/control"
	"github.com/cube-dev/cube/internal/errdefs"
)

// Command is the subcommand of the cube and cube-shim binaries that runs
// Main, for hosts where BinaryName is not installed next to them.
const Command = "supervise"

// BinaryName is the small static binary that runs only Main.
const BinaryName = "cube-supervisor"

// Args returns the arguments (after the binary or Command) that hand the
// sandbox whose init is initPID and whose cgroup is cg over to Main.
func Args(stateDir string, initPID int, cg control.Group) []string {
	b, _ := json.Marshal(cg) // a struct of strings and bools: cannot fail
	return []string{"--state-dir", stateDir, "--init-pid", fmt.Sprint(initPID), "--cgroup", string(b)}
}

// Main is the body of `cube-supervisor --state-dir DIR --init-pid PID
// --cgroup JSON [--ready-fd N --ready-timeout D --init-log FILE]`. It
// expects fd 3 to be the status pipe on which the shim already said hello;
// it reports "done" there once it serves (and, with --ready-fd, once the
// sandbox is ready: see ReadyWait).
func Main(args []string) int {
	fs := flag.NewFlagSet(BinaryName, flag.ContinueOnError)
	stateDir := fs.String("state-dir", "", "sandbox state directory")
	initPID := fs.Int("init-pid", 0, "pid of the sandbox's init, a child of this process")
	cgJSON := fs.String("cgroup", "", "the sandbox's cgroup (JSON of control.Group)")
	var ready ReadyWait
	fs.IntVar(&ready.FD, "ready-fd", 0, "read end of the init's ready pipe: report done once it gets a byte (0: ready already)")
	fs.DurationVar(&ready.Timeout, "ready-timeout", 30*time.Second, "how long to wait on --ready-fd")
	fs.StringVar(&ready.InitLog, "init-log", "", "the init's log, quoted when it fails to get ready")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("stateDir", *stateDir)
	status := os.NewFile(StatusFD, "status")
	var cg control.Group
	if err := json.Unmarshal([]byte(*cgJSON), &cg); err != nil || *stateDir == "" || *initPID <= 0 || status == nil {
		log.Error("supervisor needs --state-dir, --init-pid, --cgroup and a status pipe on fd 3", "cgroup", *cgJSON, "err", err)
		return 2
	}
	if err := run(log, *stateDir, *initPID, cg, status, ready); err != nil {
		log.Error("supervisor failed", "err", err)
		return 1
	}
	return 0
}

// sandbox is the init (by pidfd) and its cgroup.
type sandbox struct {
	init *Child
	cg   control.Group
}

// KillInit SIGKILLs the init, which takes its pid namespace with it.
func (s *sandbox) KillInit() error {
	if err := s.init.Kill(); err != nil {
		return fmt.Errorf("kill init %d: %w", s.init.Pid(), err)
	}
	return nil
}

// Kill SIGKILLs the init, which takes its pid namespace with it, then
// whatever else is in the cgroup.
func (s *sandbox) Kill(ctx context.Context) error {
	if err := s.init.Kill(); err != nil {
		return fmt.Errorf("kill init %d: %w", s.init.Pid(), err)
	}
	return s.cg.Kill(ctx)
}

func (s *sandbox) Freeze(ctx context.Context) error { return s.cg.Freeze(ctx) }
func (s *sandbox) Thaw(ctx context.Context) error   { return s.cg.Thaw(ctx) }

func run(log *slog.Logger, stateDir string, initPID int, cg control.Group, status *os.File, ready ReadyWait) error {
	// A terminal's hangup or ^C must not end the sandbox. SIGTERM and
	// SIGKILL do: the supervisor dies, and the init's parent-death signal
	// (SIGKILL) takes the sandbox's pid namespace with it; the agent finds
	// the shim gone without an exit record and cleans up. SIGTERM is not
	// caught on purpose: os/signal.Notify costs every sandbox two more
	// threads (the runtime's signal-receiving and signal-mask threads),
	// ~110 KiB of kernel stacks and runtime memory, measured.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)

	enc := json.NewEncoder(status)
	fail := func(err error) error {
		_ = enc.Encode(Report{Stage: "done", Error: err.Error(), Code: errdefs.HTTPStatus(err)})
		return err
	}
	init, err := OpenChild(initPID)
	if err != nil {
		return fail(fmt.Errorf("adopt sandbox init: %w", err))
	}
	sb := &sandbox{init: init, cg: cg}
	initDone := make(chan struct{})
	var initExit ExitStatus // set before initDone closes
	go func() {
		initExit = waitInit(log, init)
		close(initDone)
	}()
	abort := func(err error) error {
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if kerr := sb.Kill(kctx); kerr != nil {
			err = errors.Join(err, kerr)
		}
		<-initDone
		return fail(err)
	}
	if ready.FD > 0 {
		if err := ready.wait(initDone, func() ExitStatus { return initExit }); err != nil {
			return abort(err)
		}
	}

	sock := filepath.Join(stateDir, SocketFile)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return abort(fmt.Errorf("listen on %s: %w", sock, err))
	}
	defer os.Remove(sock)
	started := time.Now().UTC()
	srv := newServer(sb, State{ShimPID: os.Getpid(), InitPID: initPID, Running: true, StartedAt: started, Version: Version})
	info := Info{Schema: SchemaVersion, PID: os.Getpid(), InitPID: initPID, Version: Version, Socket: sock, StartedAt: started}
	// Written without an fsync: the agent waits for the report below, and
	// the fsync (several ms on a busy disk) follows it.
	infoFile := filepath.Join(stateDir, InfoFile)
	if err := atomicfile.ReplaceJSON(infoFile, info, 0o644); err != nil {
		ln.Close()
		return abort(fmt.Errorf("record shim: %w", err))
	}
	if err := enc.Encode(Report{Stage: "done", PID: os.Getpid(), InitPID: initPID}); err != nil {
		// The agent gave up waiting: nobody will manage this sandbox.
		ln.Close()
		return abort(fmt.Errorf("agent went away during start: %w", err))
	}
	status.Close()
	atomicfile.SyncFile(infoFile)
	log.Info("sandbox started", "shimPid", os.Getpid(), "initPid", initPID)

	go srv.serve(ln)
	<-initDone
	exit := initExit
	exit.Schema = SchemaVersion
	// Written without an fsync, like shim.json: a /kill waits for it, and
	// concurrent kills queued their fsyncs behind the disk's journal. The
	// record only matters while the machine runs (a reboot ends every
	// sandbox, and the agent then reports "its supervisor is gone").
	if err := atomicfile.ReplaceJSON(filepath.Join(stateDir, ExitFile), exit, 0o644); err != nil {
		log.Error("record exit", "err", err)
	}
	srv.markExited(exit)
	log.Info("sandbox exited", "exitCode", exit.ExitCode, "signal", exit.Signal)
	// Kill whatever the init left behind (processes that escaped its pid
	// namespace cannot exist, but the workload decides).
	kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cg.Kill(kctx); err != nil {
		log.Error("kill leftovers", "err", err)
	}
	ln.Close()
	srv.drain(5 * time.Second)
	return nil
}

// waitInit blocks until the init has exited and reaps it.
func waitInit(log *slog.Logger, init *Child) ExitStatus {
	if err := init.Wait(context.Background()); err != nil {
		log.Error("wait for init", "err", err)
	}
	e, err := init.Status(true)
	if err != nil {
		log.Error("reap init", "err", err)
		return ExitStatus{ExitCode: -1, ExitedAt: time.Now().UTC()}
	}
	return e
}
