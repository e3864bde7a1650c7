package interp

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// SuperviseFlag, first on the command line, makes cube-interp the
// supervisor of its server (ServeAndExec starts it so).
const SuperviseFlag = "--supervise"

// Restart delays of a server that keeps exiting: the first restart waits
// restartMin, each quick exit doubles it up to restartMax, and a server
// that ran restartReset or longer is restarted after restartMin again.
const (
	restartMin   = time.Second
	restartMax   = 30 * time.Second
	restartReset = time.Minute
)

// nextRestartDelay is the wait before restarting a server that exited
// after running for ran, when the previous wait was prev (0: none yet).
func nextRestartDelay(prev, ran time.Duration) time.Duration {
	if prev == 0 || ran >= restartReset {
		return restartMin
	}
	return min(2*prev, restartMax)
}

// Supervise runs the server (this executable with serverArgs) and starts
// it again whenever it exits, so a crash of the code-interpreter server
// costs its contexts (the kernels die with it: Pdeathsig) but not the
// sandbox's port 49999 for good. ready (may be nil) gets one byte once the
// first server listens; if the first server exits before listening
// (bad flags, no kernels dir...), Supervise returns its error instead of
// retrying what never worked. Otherwise it does not return. The server
// gets SIGTERM when the supervisor dies (Pdeathsig), so stopping the
// supervisor stops the server.
func Supervise(log *slog.Logger, serverArgs []string, ready *os.File) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Pdeathsig fires when the thread that started the child ends: keep
	// this goroutine on one thread for good.
	runtime.LockOSThread()
	if ready != nil {
		// Inherited without close-on-exec: no server may keep it (the
		// sandbox's start waits for its EOF).
		syscall.CloseOnExec(int(ready.Fd()))
	}
	var delay time.Duration
	for first := true; ; first = false {
		start := time.Now()
		cmd, err := startSupervised(exe, serverArgs)
		switch {
		case err != nil && first:
			return err
		case err == nil:
			if ready != nil {
				_, _ = ready.Write([]byte{1})
				_ = ready.Close()
				ready = nil
			}
			if !first {
				log.Info("code interpreter server restarted", "pid", cmd.Process.Pid)
			}
			err = cmd.Wait()
		}
		ran := time.Since(start)
		delay = nextRestartDelay(delay, ran)
		log.Warn("code interpreter server exited; restarting", "err", err, "ran", ran.Round(time.Millisecond), "restartIn", delay)
		time.Sleep(delay)
	}
}

// startSupervised starts one server with a ready pipe and returns once it
// listens; the caller waits for it. A server that exits first is reaped
// here and is an error.
func startSupervised(exe string, serverArgs []string) (*exec.Cmd, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe, append([]string{"--ready-fd", "3"}, serverArgs...)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	// No deadline: a server either writes its byte or exits (EOF); the
	// sandbox's start waits in ServeAndExec with its own bound.
	if _, err := r.Read(make([]byte, 1)); err != nil {
		return nil, fmt.Errorf("server exited before listening: %w", cmd.Wait())
	}
	return cmd, nil
}
