// Package reaper lets envd run as PID 1 of a sandbox: the PID-1 copy
// re-executes the binary as its only child, reaps every orphan the kernel
// hands it, and exits with the child's status. The child (the real envd)
// keeps exec.Cmd.Wait working for its own processes because nobody else
// waits for them.
//
// The reaper waits in a blocking wait4 and catches no signal: os/signal
// would cost every sandbox two more threads (the runtime's signal threads),
// ~3 threads instead of ~6.5 per pid 1, measured. A termination signal
// (SIGTERM, SIGINT, SIGHUP, SIGQUIT) therefore ends pid 1 through the Go
// runtime's default action, and with it the whole pid namespace: the
// sandbox stops at once instead of envd being asked first. Cube never
// sends pid 1 anything but SIGKILL.
package reaper

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// envMarker tells the re-executed child that it is not the reaper.
const envMarker = "CUBE_ENVD_REAPED=1"

// Needed reports whether this process is PID 1 and has not been re-executed
// yet, i.e. whether it should call Run instead of serving.
func Needed() bool {
	return os.Getpid() == 1 && os.Getenv("CUBE_ENVD_REAPED") == ""
}

// Run starts the current executable with args as a child (envd re-executing
// itself when it finds itself pid 1); see Start.
func Run(args []string, inheritFD int) (int, error) {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return start(exe, append([]string{os.Args[0]}, args...), inheritFD)
}

// start starts path with argv as a child, passing on fd inheritFD (if > 2)
// at the same number, reaps all children until that child exits, and
// returns the exit code to use (128+signal when the child was killed by a
// signal). cmd/cube-reaper (C) does the same for sandboxes whose pid 1 is
// not envd.
func start(path string, argv []string, inheritFD int) (int, error) {
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	var inherited *os.File
	if inheritFD > 2 {
		inherited = os.NewFile(uintptr(inheritFD), "inherited")
		for len(files) < inheritFD {
			files = append(files, nil)
		}
		files = append(files, inherited)
	}
	child, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   append(os.Environ(), envMarker),
		Files: files,
	})
	if inherited != nil {
		_ = inherited.Close()
	}
	if err != nil {
		return 1, fmt.Errorf("start %s: %w", path, err)
	}
	return reapUntil(child.Pid)
}

// AdoptEnv names the variable through which a sandbox runtime that started
// envd itself (in a user namespace, see nsrt.Spec.Reaper) tells the PID-1
// copy the pid of the serving envd: that copy then only reaps (Adopt).
const AdoptEnv = "CUBE_REAP_PID"

// Adopted returns the pid in AdoptEnv, if set.
func Adopted() (int, bool) {
	pid, err := strconv.Atoi(os.Getenv(AdoptEnv))
	return pid, err == nil && pid > 1
}

// Adopt reaps every child of this process until the existing child pid
// exits and returns the exit code to use (128+signal when the child was
// killed by a signal).
func Adopt(pid int) (int, error) { return reapUntil(pid) }

// reapUntil collects every child that exits, blocking in wait4 (one
// thread, no signal handling), until main is among them, and returns the
// exit code to use for main's end.
func reapUntil(main int) (int, error) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 1, fmt.Errorf("wait for %d: %w", main, err)
		}
		if pid != main {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus(), nil
		case ws.Signaled():
			return 128 + int(ws.Signal()), nil
		default:
			return 1, nil
		}
	}
}
