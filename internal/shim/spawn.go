package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/mountns"
	"github.com/cube-dev/cube/internal/pidfd"
	"github.com/cube-dev/cube/internal/supervisor"
)

// spawned is what a successfully started shim reported.
type spawned struct {
	PID     int
	InitPID int
}

// Spawn starts `exe shim --state-dir stateDir` in a session of its own (one
// exec: no signal to the caller's process group reaches it, and it does not
// depend on the caller) and blocks (bounded by ctx) until the shim reports
// that its workload is ready or failed, then returns a client for it. The
// shim's stderr goes to stateDir/shim.log. On any failure, including ctx
// ending, the shim is SIGKILLed and awaited before Spawn
// returns, so no supervisor is left behind; the error carries the shim's
// message and error kind.
func Spawn(ctx context.Context, exe, stateDir string) (*Client, error) {
	return SpawnIn(ctx, nil, exe, stateDir)
}

// SpawnIn is Spawn with the shim started in mount namespace ns (nil: this
// process's): exe and stateDir are paths there, and the shim, its
// supervisor and its sandbox live there, holding nothing of this process's
// mount namespace (see package mountns). Its log and stdin are opened there
// too.
func SpawnIn(ctx context.Context, ns *mountns.NS, exe, stateDir string) (*Client, error) {
	return SpawnPlaced(ctx, ns, exe, stateDir, nil)
}

// Place puts the calling OS thread where the shim should start (its
// cgroups; see cgroup.JoinThread) and returns an fd for CLONE_INTO_CGROUP,
// or -1. The thread is discarded after the fork. A failed Place does not
// fail the spawn: the shim starts where the caller is and moves itself.
type Place func() (cgroupFD int, err error)

// SpawnPlaced is SpawnIn with the shim forked from a fresh thread that
// place has put in the shim's cgroups, so it starts there instead of
// migrating (a migration waits for an RCU grace period on cgroup v1). It
// applies only to shims started in this process's mount namespace (ns
// nil): place resolves cgroup paths in the caller's.
func SpawnPlaced(ctx context.Context, ns *mountns.NS, exe, stateDir string, place Place) (*Client, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	newCmd := func() *exec.Cmd {
		cmd := exec.Command(exe, Command, "--state-dir", stateDir)
		cmd.Env = supervisorEnv(os.Environ())
		cmd.ExtraFiles = []*os.File{pw}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		return cmd
	}
	cmd := newCmd()
	start := func() error {
		logf, err := os.OpenFile(filepath.Join(stateDir, supervisor.LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open shim log: %w", err)
		}
		defer logf.Close()
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start shim: %w", err)
		}
		return nil
	}
	switch {
	case ns != nil:
		err = ns.Do(start)
	case place != nil:
		err = onDiscardedThread(func() error {
			if fd, perr := place(); perr == nil && fd >= 0 {
				defer syscall.Close(fd)
				cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
				if err := start(); err == nil {
					return nil
				}
				// No clone3/CLONE_INTO_CGROUP here: fork without it.
				cmd = newCmd()
			}
			return start()
		})
	default:
		err = start()
	}
	pw.Close() // the shim holds the only write ends now: EOF means it died
	if err != nil {
		return nil, err
	}
	// A pidfd for the child, opened before anything can reap it: a shim
	// that fails its start reports and exits at once, and by the time its
	// hello is read it may be gone (its report still in the pipe).
	child, _ := pidfd.Open(cmd.Process.Pid)
	defer func() {
		if child != nil {
			child.Close()
		}
	}()
	// The shim is our child until we exit; reap it whenever it ends (the
	// sandbox's end, a failed start). After an agent restart it belongs to
	// the host's init or the nearest subreaper instead.
	go reap(cmd)

	stop := context.AfterFunc(ctx, func() { _ = pr.SetReadDeadline(time.Now()) })
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		_ = pr.SetReadDeadline(d)
	}
	dec := json.NewDecoder(pr)
	var shim *pidfd.FD
	res, err := readReports(dec, func(pid int) error {
		if child != nil && pid == cmd.Process.Pid {
			shim, child = child, nil
			return nil
		}
		var oerr error
		shim, oerr = pidfd.Open(pid)
		return oerr
	})
	var c *Client
	if err == nil {
		var info supervisor.Info
		if info, err = supervisor.ReadInfo(stateDir); err == nil && (info.PID != res.PID || info.InitPID != res.InitPID) {
			err = fmt.Errorf("shim.json (pid %d) does not match the shim's report (pid %d): %w", info.PID, res.PID, errdefs.ErrConflict)
		}
		if err == nil {
			c = newClient(stateDir, info, shim)
		}
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
			err = fmt.Errorf("shim did not report within the deadline: %w: %w", errdefs.ErrUnavailable, ctx.Err())
		}
		if shim != nil {
			_ = shim.Kill()
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if werr := shim.Wait(wctx); werr != nil {
				err = errors.Join(err, werr)
			}
			cancel()
			shim.Close()
		}
	}
	return c, err
}

// onDiscardedThread runs fn on a locked OS thread that ends with it (fn
// may change the thread's cgroups). The main thread cannot end; when the
// goroutine lands on it, it holds it and tries again.
func onDiscardedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if unix.Gettid() == unix.Getpid() {
			errc <- onDiscardedThread(fn)
			runtime.UnlockOSThread()
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// reap collects the shim's exit status once it has exited. The wait itself
// goes through a pidfd on the runtime poller, so hundreds of live shims cost
// no blocked OS threads; cmd.Wait then returns at once.
func reap(cmd *exec.Cmd) {
	if p, err := pidfd.Open(cmd.Process.Pid); err == nil {
		_ = p.Wait(context.Background())
		p.Close()
	}
	_ = cmd.Wait()
}

// readReports reads the hello and done lines of the status pipe. A shim
// that reported a failed start is not "vanished" because it has exited
// since its hello: its own error wins.
func readReports(dec *json.Decoder, hello func(pid int) error) (spawned, error) {
	var r supervisor.Report
	if err := dec.Decode(&r); err != nil {
		return spawned{}, fmt.Errorf("shim exited without reporting (see %s): %w: %w", supervisor.LogFile, errdefs.ErrUnavailable, eofIsUnexpected(err))
	}
	var vanished error
	if r.Stage == "hello" {
		if err := hello(r.PID); err != nil {
			vanished = fmt.Errorf("shim %d vanished: %w", r.PID, err)
		}
		r = supervisor.Report{}
		if err := dec.Decode(&r); err != nil {
			if vanished != nil {
				return spawned{}, vanished
			}
			return spawned{}, fmt.Errorf("shim exited without reporting (see %s): %w: %w", supervisor.LogFile, errdefs.ErrUnavailable, eofIsUnexpected(err))
		}
	}
	switch {
	case r.Stage != "done":
		return spawned{}, fmt.Errorf("shim reported stage %q, want done: %w", r.Stage, errdefs.ErrUnavailable)
	case r.Error != "":
		return spawned{}, fmt.Errorf("%s: %w", r.Error, kindOf(r.Code))
	case vanished != nil:
		return spawned{}, vanished
	}
	return spawned{PID: r.PID, InitPID: r.InitPID}, nil
}

func eofIsUnexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// supervisorEnv is the shim's environment: the caller's, with GOMAXPROCS=1.
// A shim supervises one sandbox and answers a handful of requests, so one
// P is plenty, and every P costs the Go runtime a span cache per size class:
// 1.35 -> 1.07 MiB of anonymous memory per sandbox, measured. The sandbox
// never sees it: nsrt gives sandbox-init and the workload explicit
// environments.
func supervisorEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			out = append(out, kv)
		}
	}
	return append(out, "GOMAXPROCS=1")
}
