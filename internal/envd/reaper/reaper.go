// Package reaper lets envd run as PID 1 of a sandbox: the PID-1 copy
// re-executes the binary as its only child, reaps every orphan the kernel
// hands it, forwards termination signals to the child, and exits with the
// child's status. The child (the real envd) keeps exec.Cmd.Wait working for
// its own processes because nobody else waits for them.
package reaper

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

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

// Start starts argv (argv[0] is the program's path) as a child, passing on
// fd inheritFD (if > 2) at the same number, reaps all children until that
// child exits, and returns the exit code to use (128+signal when the child
// was killed by a signal).
func Start(argv []string, inheritFD int) (int, error) {
	if len(argv) == 0 {
		return 2, errors.New("nothing to start")
	}
	return start(argv[0], argv, inheritFD)
}

func start(path string, argv []string, inheritFD int) (int, error) {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)

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
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			_ = child.Signal(sig)
			continue
		}
		if code, done := reapAll(child.Pid); done {
			return code, nil
		}
	}
	return 1, errors.New("signal channel closed")
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
// exits, forwarding termination signals to it, and returns the exit code to
// use (128+signal when the child was killed by a signal).
func Adopt(pid int) (int, error) {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	// The child may have exited before the handler was installed.
	if code, done := reapAll(pid); done {
		return code, nil
	}
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			_ = unix.Kill(pid, sig.(syscall.Signal))
			continue
		}
		if code, done := reapAll(pid); done {
			return code, nil
		}
	}
	return 1, errors.New("signal channel closed")
}

// reapAll collects every exited child; it reports the exit code of the
// child with pid main once that one is among them.
func reapAll(main int) (code int, done bool) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return code, done
		}
		if pid == main {
			done = true
			switch {
			case ws.Exited():
				code = ws.ExitStatus()
			case ws.Signaled():
				code = 128 + int(ws.Signal())
			default:
				code = 1
			}
		}
	}
}
