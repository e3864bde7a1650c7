package nsrt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cgroup/control"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/shim"
	"github.com/cube-dev/cube/internal/supervisor"
)

// InitCommand is the subcommand of the cube binary that runs InitMain.
const InitCommand = "sandbox-init"

// syncFD is the fd on which sandbox-init waits until the shim has put it
// into the sandbox cgroup.
const syncFD = 4

// layerFD is the fd on which sandbox-init writes a byte once its writable
// layer is prepared (the disk mounted): that happens before it joins the
// sandbox cgroup, whose device allowlist has no loop devices.
const layerFD = 5

// ShimMain is the body of `cube shim`; args are the arguments after the
// subcommand.
func ShimMain(args []string) int {
	return shim.Main(args, launch)
}

// ShimCgroup is the cgroup (relative to each hierarchy root) holding the
// shims of sandboxes under cgroup parent p: outside the agent's cgroup and
// outside every sandbox's.
func ShimCgroup(parent string) string {
	if parent == "" {
		parent = cgroup.DefaultParent
	}
	return parent + "-shims"
}

// workload is a running sandbox init as the shim sees it.
type workload struct {
	pid    int
	cg     *cgroup.Cgroup
	done   chan struct{} // closed when init has exited (it is not reaped)
	status supervisor.ExitStatus
	once   sync.Once
	execs  chan supervisorExec // to the thread that started the init
}

// supervisorExec asks the init's parent thread to exec; err gets the
// failure (success never answers).
type supervisorExec struct {
	path      string
	argv, env []string
	err       chan error
}

func (w *workload) Pid() int                       { return w.pid }
func (w *workload) Cgroup() control.Group          { return w.cg.Control() }
func (w *workload) Kill(ctx context.Context) error { return killInit(ctx, w) }

func (w *workload) Exec(path string, argv, env []string) error {
	req := supervisorExec{path: path, argv: argv, env: env, err: make(chan error, 1)}
	w.execs <- req
	return <-req.err
}

// killInit kills the init and everything in the sandbox cgroup and waits
// (bounded by ctx) until the init has exited.
func killInit(ctx context.Context, w *workload) error {
	_ = syscall.Kill(w.pid, syscall.SIGKILL)
	err := w.cg.Kill(ctx)
	select {
	case <-w.done:
		return err
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("init %d did not exit: %w", w.pid, errdefs.ErrUnavailable))
	}
}

// launch runs in the detached shim: it starts sandbox-init in new
// namespaces, moves it into the sandbox cgroup, releases it and waits for
// the init's readiness byte.
func launch(ctx context.Context, stateDir string) (_ shim.Workload, err error) {
	spec, err := readSpec(stateDir)
	if err != nil {
		return nil, err
	}
	spec = spec.withDefaults()
	// The agent forks the shim into its cgroup already (shim.SpawnPlaced);
	// MoveAll would only wait for the kernel's RCU grace period then.
	if name := ShimCgroup(spec.CgroupParent); !cgroup.InAll(name) {
		if err := cgroup.MoveAll(name, os.Getpid()); err != nil {
			return nil, fmt.Errorf("move shim out of the agent's cgroup: %w", err)
		}
	} else {
		// Putting the init into the sandbox cgroup below waits for an
		// RCU grace period on cgroup v1 unless one ended just before:
		// start it now, while the init starts (the agent did too, at the
		// start of the create; this keeps it fresh).
		cgroup.PrimeMigration(name)
	}
	cg, err := cgroup.Open(spec.CgroupParent, spec.ID)
	if err != nil {
		return nil, err
	}
	if spec.DiskSizeMB > 0 {
		if err := placeDisk(stateDir, spec); err != nil {
			return nil, err
		}
	}
	res := spec.Resources
	if res.Devices == nil {
		res.Devices = cgroup.SandboxDevices
	}
	if err := cg.Create(res); err != nil {
		return nil, fmt.Errorf("create sandbox cgroup: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(stateDir, InitLog), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	syncR, syncW, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	defer syncW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		logf.Close()
		syncR.Close()
		return nil, err
	}
	defer readyR.Close()
	layerR, layerW, err := os.Pipe()
	if err != nil {
		logf.Close()
		syncR.Close()
		readyW.Close()
		return nil, err
	}
	defer layerR.Close()

	w := &workload{cg: cg, done: make(chan struct{}), execs: make(chan supervisorExec)}
	started := make(chan error, 1)
	go runInit(spec, stateDir, []*os.File{logf, readyW, syncR, layerW}, w, started)
	err = <-started
	logf.Close()
	readyW.Close()
	syncR.Close()
	layerW.Close()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = killInit(kctx, w)
			if tail := logTail(stateDir, 2048); tail != "" {
				err = fmt.Errorf("%w; init output: %s", err, tail)
			}
		}
	}()
	if err := waitByte(layerR, spec.ReadyTimeout); err != nil {
		return nil, fmt.Errorf("sandbox-init did not prepare its writable layer: %w", err)
	}
	if err := cg.AddProc(w.pid); err != nil {
		return nil, fmt.Errorf("put init into the sandbox cgroup: %w", err)
	}
	if _, err := syncW.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("release sandbox-init: %w", err)
	}
	syncW.Close()
	return w, waitReady(readyR, w, spec.ReadyTimeout)
}

// waitReady blocks until init writes to its ready fd, exits, or the
// timeout passes.
func waitReady(readyR *os.File, w *workload, timeout time.Duration) error {
	if err := readyR.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var b [1]byte
	n, err := readyR.Read(b[:])
	switch {
	case n == 1:
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("sandbox init not ready after %s: %w", timeout, errdefs.ErrUnavailable)
	case errors.Is(err, io.EOF):
		// The ready fd closed: init exited (or closed it) before writing.
		select {
		case <-w.done:
			return fmt.Errorf("sandbox init exited before it was ready (exit code %d%s): %w",
				w.status.ExitCode, sigSuffix(w.status.Signal), errdefs.ErrFailedPrecondition)
		case <-time.After(2 * time.Second):
			return fmt.Errorf("sandbox init closed its ready fd without writing: %w", errdefs.ErrFailedPrecondition)
		}
	default:
		return fmt.Errorf("read init readiness: %w", err)
	}
}

// waitByte reads one byte from r within timeout.
func waitByte(r *os.File, timeout time.Duration) error {
	if err := r.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var b [1]byte
	if n, err := r.Read(b[:]); n != 1 {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("no answer after %s: %w", timeout, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	return nil
}

func sigSuffix(sig string) string {
	if sig == "" {
		return ""
	}
	return ", signal " + sig
}

// runInit starts sandbox-init on a thread that is locked for the rest of
// this process image: Pdeathsig is tied to the forking thread, so the
// thread must neither exit nor return to the scheduler while the init
// lives. When the sandbox lives in an existing network namespace the thread
// joins it for the clone and returns to its own right after. The init is
// watched through a pidfd and never reaped here: once the sandbox is ready
// the same thread execs the supervisor (workload.Exec), which adopts the
// init as its child and reaps it. files are the init's stdout/stderr,
// ready fd (3), sync fd (4) and layer fd (5).
func runInit(spec Spec, stateDir string, files []*os.File, w *workload, started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
	if err := startInit(spec, stateDir, files, w); err != nil {
		w.once.Do(func() { close(w.done) })
		started <- err
		return
	}
	init, err := supervisor.OpenChild(w.pid)
	if err != nil {
		_ = syscall.Kill(w.pid, syscall.SIGKILL)
		w.once.Do(func() { close(w.done) })
		started <- err
		return
	}
	go func() {
		defer w.once.Do(func() { close(w.done) })
		if err := init.Wait(context.Background()); err == nil {
			// WNOWAIT: the supervisor after the exec reaps it.
			w.status, _ = init.Status(false)
		}
	}()
	started <- nil
	for req := range w.execs {
		req.err <- syscall.Exec(req.path, req.argv, req.env)
	}
}

// startInit clones sandbox-init into its namespaces from the calling
// (locked) thread and records its pid.
func startInit(spec Spec, stateDir string, files []*os.File, w *workload) (err error) {
	flags := uintptr(unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC)
	if spec.NetNSPath == "" {
		flags |= unix.CLONE_NEWNET
	} else {
		restore, jerr := enterNetNS(spec.NetNSPath)
		if jerr != nil {
			return jerr
		}
		defer func() {
			if rerr := restore(); rerr != nil {
				// The thread would carry the sandbox's netns into the
				// supervisor; give up on this start (the locked thread
				// exits with runInit's goroutine).
				if err == nil {
					_ = syscall.Kill(w.pid, syscall.SIGKILL)
				}
				err = errors.Join(err, rerr)
			}
		}()
	}
	cmd := exec.Command("/proc/self/exe", InitCommand, "--state-dir", stateDir)
	cmd.Args[0] = os.Args[0]
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = files[0], files[0]
	cmd.ExtraFiles = files[1:]
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL, Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start sandbox-init: %w", err)
	}
	w.pid = cmd.Process.Pid
	return nil
}

// enterNetNS moves the calling thread into the network namespace at path
// and returns how to move it back.
func enterNetNS(path string) (restore func() error, err error) {
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open own netns: %w", err)
	}
	if err := joinNetNS(path); err != nil {
		unix.Close(self)
		return nil, err
	}
	return func() error {
		defer unix.Close(self)
		if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("return to own netns: %w", err)
		}
		return nil
	}, nil
}

func joinNetNS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w: %w", path, errdefs.ErrNotFound, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("join netns %s: %w", path, err)
	}
	return nil
}
