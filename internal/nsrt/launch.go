package nsrt

import (
	"context"
	"errors"
	"fmt"
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

// initEnv is sandbox-init's environment. GOMAXPROCS=1: with a second P the
// Go runtime wakes or makes another thread for each goroutine it starts,
// ~0.3 ms of CPU per start, and pid 1 and B (the user namespace's workload
// process, started with it too) work one step at a time. Neither passes its
// environment on: the workload gets Spec.Env, the reaper reaperEnv.
var initEnv = []string{"PATH=" + DefaultPath, "GOMAXPROCS=1"}

// DefaultPath is the PATH of a sandbox's processes unless their Spec.Env
// says otherwise, and of sandbox-init itself.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// syncFD is the socket on which sandbox-init waits for the shim's release
// message (initsync.go).
const syncFD = 4

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
	// placed: the init was forked into cg (no migration; see startInit).
	placed bool
	// ready is the read end of the init's ready pipe, which the
	// supervisor inherits and waits on (readyWait).
	ready     *os.File
	readyWait supervisor.ReadyWait
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

func (w *workload) Ready() supervisor.ReadyWait { return w.readyWait }

func (w *workload) Exec(path string, argv, env []string) error {
	// The supervisor inherits the ready pipe (Ready names its fd).
	if w.ready != nil {
		if _, err := unix.FcntlInt(uintptr(w.readyWait.FD), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("pass the ready pipe on: %w", err)
		}
	}
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
// namespaces, in the sandbox cgroup, mounts the sandbox's disk, releases
// the init and returns; the supervisor it execs next waits for the init's
// readiness byte (workload.Ready).
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
	}
	cg, err := spec.openCgroup()
	if err != nil {
		return nil, err
	}
	// The disk is mounted here, outside the sandbox cgroup (its device
	// allowlist has no loop devices), on another thread while the cgroup
	// is made and the init starts; the init gets the mount at its release.
	var disk *os.File
	var diskc chan mountResult
	defer func() {
		if diskc != nil { // not collected: wait for it and drop it
			if r := <-diskc; r.f != nil {
				r.f.Close()
			}
		}
		if disk != nil {
			disk.Close()
		}
	}()
	if spec.DiskSizeMB > 0 {
		if err := placeDisk(stateDir, spec); err != nil {
			return nil, err
		}
		diskc = make(chan mountResult, 1)
		go func() {
			f, err := mountDiskDetached(stateDir)
			diskc <- mountResult{f, err}
		}()
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
	syncShim, syncInit, err := syncSocket()
	if err != nil {
		logf.Close()
		return nil, err
	}
	defer syncShim.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		logf.Close()
		syncInit.Close()
		return nil, err
	}
	defer func() {
		if err != nil {
			readyR.Close()
		}
	}()

	w := &workload{cg: cg, done: make(chan struct{}), execs: make(chan supervisorExec)}
	started := make(chan error, 1)
	go runInit(spec, stateDir, []*os.File{logf, readyW, syncInit}, w, started)
	err = <-started
	logf.Close()
	readyW.Close()
	syncInit.Close()
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
	if diskc != nil {
		r := <-diskc
		diskc, disk = nil, r.f
		if r.err != nil {
			return nil, r.err
		}
	}
	how := syncPlaced
	if !w.placed {
		// A migration (it waits for an RCU grace period on cgroup v1):
		// only where the init could not be forked into its cgroup.
		how = syncMoved
		if err := cg.AddProc(w.pid); err != nil {
			return nil, fmt.Errorf("put init into the sandbox cgroup: %w", err)
		}
	}
	if err := sendSync(syncShim, how, disk); err != nil {
		return nil, err
	}
	syncShim.Close()
	// The supervisor waits for the ready byte: its exec and start overlap
	// the sandbox's own instead of following it.
	fd, err := rawFD(readyR)
	if err != nil {
		return nil, err
	}
	w.ready = readyR
	w.readyWait = supervisor.ReadyWait{FD: fd, Timeout: spec.ReadyTimeout, InitLog: filepath.Join(stateDir, InitLog)}
	return w, nil
}

// runInit starts sandbox-init on a thread that is locked for the rest of
// this process image: Pdeathsig is tied to the forking thread, so the
// thread must neither exit nor return to the scheduler while the init
// lives. When the sandbox lives in an existing network namespace the thread
// joins it for the clone and returns to its own right after. The init is
// watched through a pidfd and never reaped here: once the sandbox is ready
// the same thread execs the supervisor (workload.Exec), which adopts the
// init as its child and reaps it. files are the init's stdout/stderr,
// ready fd (3) and sync socket (4).
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
	cgFD, leave, err := joinForClone(w.cg, spec.CgroupParent)
	if err != nil {
		return err
	}
	newCmd := func() *exec.Cmd {
		cmd := exec.Command("/proc/self/exe", InitCommand, "--state-dir", stateDir)
		cmd.Args[0] = os.Args[0]
		cmd.Env = initEnv // PATH, and one P
		cmd.Stdout, cmd.Stderr = files[0], files[0]
		cmd.ExtraFiles = files[1:]
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL, Setsid: true}
		return cmd
	}
	cmd := newCmd()
	w.placed = leave != nil || cgFD >= 0
	if cgFD >= 0 {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, cgFD
	}
	err = cmd.Start()
	if err != nil && cgFD >= 0 {
		// No clone3/CLONE_INTO_CGROUP here: the shim moves the init.
		cmd, w.placed = newCmd(), false
		err = cmd.Start()
	}
	if cgFD >= 0 {
		unix.Close(cgFD)
	}
	if leave != nil {
		if lerr := leave(); lerr != nil {
			// The thread would exec the supervisor inside the sandbox's
			// cgroup, where a freeze or kill of the sandbox reaches it.
			if err == nil {
				_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			}
			return errors.Join(err, lerr)
		}
	}
	if err != nil {
		return fmt.Errorf("start sandbox-init: %w", err)
	}
	w.pid = cmd.Process.Pid
	return nil
}

// joinForClone prepares the calling (locked) thread so that the process it
// forks next starts in cg, with no migration (which waits for an RCU grace
// period on cgroup v1, ~15 ms on the project's VM): on v1 the thread moves
// itself into cg, and leave moves it back to the shims' cgroup (the thread
// execs the supervisor later, which must stay outside the sandbox's); on
// v2 it returns an fd for CLONE_INTO_CGROUP (the caller closes it). When
// neither works (leave nil, fd -1) the init starts where the shim is and
// the shim moves it.
func joinForClone(cg *cgroup.Cgroup, parent string) (cgFD int, leave func() error, err error) {
	// The shim is in its cgroup in every hierarchy (launch checked or
	// moved it there), so going back is one write per hierarchy that
	// JoinThread touched.
	back := func() error {
		if err := cg.LeaveThread(ShimCgroup(parent)); err != nil {
			return fmt.Errorf("return the shim's thread to its cgroup: %w", err)
		}
		return nil
	}
	fd, jerr := cg.JoinThread()
	switch {
	case jerr == nil && cg.Version() == cgroup.V2:
		return fd, nil, nil
	case jerr == nil:
		return -1, back, nil
	case cg.Version() == cgroup.V2:
		return -1, nil, nil
	}
	// Partly moved: go back before forking.
	if err := back(); err != nil {
		return -1, nil, err
	}
	return -1, nil, nil
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

// mountResult is the result of mountDiskDetached.
type mountResult struct {
	f   *os.File
	err error
}

// rawFD is f's descriptor, without the switch to blocking mode that
// (*os.File).Fd makes.
func rawFD(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		return -1, err
	}
	return fd, nil
}
