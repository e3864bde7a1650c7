// Package shim starts a sandbox's per-sandbox process and reaches it.
// `cube shim` (Main) is only the start-up stage: it runs the launcher that
// builds the sandbox, then execs the supervisor (package supervisor), which
// keeps the pid and lives as long as the sandbox. The agent's side is Spawn
// (start one, wait for its report) and Client (Dial re-attaches by pidfd
// and the supervisor's socket: State, Kill, Freeze, ExitWatch). The records
// it reads and the State it returns are package supervisor's.
package shim

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/cube-dev/cube/internal/cgroup/control"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/exepath"
	"github.com/cube-dev/cube/internal/supervisor"
)

// Command is the subcommand of the cube binary that runs Main.
const Command = "shim"

// Workload is a started sandbox, as its launcher hands it over.
type Workload interface {
	// Pid is the host pid of the init, a child of this process.
	Pid() int
	// Cgroup is the sandbox's cgroup, which the supervisor freezes and kills.
	Cgroup() control.Group
	// Kill kills every process of the workload and returns once the init
	// has exited (a failed start).
	Kill(ctx context.Context) error
	// Exec replaces this process with the program at path (the
	// supervisor), keeping its pid, so that the init stays its child. It
	// runs on the thread that started the init (the init's parent-death
	// signal is tied to that thread) and returns only if the exec failed.
	Exec(path string, argv, env []string) error
	// Ready says how the supervisor waits for the workload to be ready
	// (the zero value: the launcher returned once it was).
	Ready() supervisor.ReadyWait
}

// Launcher starts the workload described by the files in stateDir and
// returns once it is ready, or once it is started and Workload.Ready hands
// the rest of the wait to the supervisor. It runs inside the detached
// shim; on error it must leave no process running.
type Launcher func(ctx context.Context, stateDir string) (Workload, error)

// Main is the body of `cube shim --state-dir DIR`; args are the arguments
// after the subcommand. Started by Spawn as the leader of a new session, it
// says hello on fd 3, runs launch, then execs the supervisor (see package
// supervisor), which reports the outcome and supervises the workload until
// its init exits. It needs nothing from the agent once started: when the
// agent exits, the shim is re-parented (to the host's init or the nearest
// subreaper) and keeps running.
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
	status := os.NewFile(supervisor.StatusFD, "status")
	if *stateDir == "" || status == nil {
		log.Error("shim needs --state-dir and a status pipe on fd 3")
		return 2
	}
	if err := start(*stateDir, status, launch); err != nil {
		log.Error("shim failed", "err", err)
		return 1
	}
	return 0
}

// start launches the workload and hands it to the supervisor; it returns
// only on failure, after reporting it.
func start(stateDir string, status *os.File, launch Launcher) error {
	enc := json.NewEncoder(status)
	if err := enc.Encode(supervisor.Report{Stage: "hello", PID: os.Getpid()}); err != nil {
		return fmt.Errorf("agent went away before the shim started: %w", err)
	}
	fail := func(err error) error {
		_ = enc.Encode(supervisor.Report{Stage: "done", Error: err.Error(), Code: errdefs.HTTPStatus(err)})
		return err
	}
	ctx := context.Background()
	w, err := launch(ctx, stateDir)
	if err != nil {
		return fail(err)
	}
	path, argv := SupervisorCommand(append(supervisor.Args(stateDir, w.Pid(), w.Cgroup()), w.Ready().Args()...))
	err = w.Exec(path, argv, os.Environ())
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if kerr := w.Kill(kctx); kerr != nil {
		err = errors.Join(err, kerr)
	}
	return fail(fmt.Errorf("exec supervisor %s: %w", path, err))
}

// SupervisorCommand is the program and command line that run the
// supervisor with args: cube-supervisor next to this binary when it is
// installed there (a small image: it lives as long as the sandbox), else
// this binary's own `supervise` subcommand.
func SupervisorCommand(args []string) (path string, argv []string) {
	if exe, err := os.Executable(); err == nil {
		if p, ok := exepath.Sibling(exe, supervisor.BinaryName); ok {
			return p, append([]string{supervisor.BinaryName}, args...)
		}
	}
	return "/proc/self/exe", append([]string{os.Args[0], supervisor.Command}, args...)
}
