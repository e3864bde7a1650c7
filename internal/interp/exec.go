package interp

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ServeAndExec starts this binary with serverArgs as a server in its own
// session, waits until it listens, then execs argv in this process (argv
// keeps the pid and the inherited descriptors; see cmd/cube-interp). The server must not keep
// descriptors meant for argv (envd's ready pipe), so every inherited one
// is marked close-on-exec for the spawn and restored for argv.
func ServeAndExec(serverArgs, argv []string) error {
	if len(argv) == 0 {
		return errors.New("nothing to exec after --")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	inherited := openFDs()
	for _, fd := range inherited {
		unix.CloseOnExec(fd)
	}
	if err := startDetached(exe, serverArgs); err != nil {
		// argv still runs: a sandbox without its code interpreter is
		// better than no sandbox (the client reports the port closed).
		fmt.Fprintln(os.Stderr, "cube-interp: start server:", err)
	}
	for _, fd := range inherited {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("restore fd %d: %w", fd, err)
		}
	}
	path := argv[0]
	if err := unix.Exec(path, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", path, err)
	}
	return nil
}

// serverListenTimeout bounds how long argv waits for the server to listen.
const serverListenTimeout = 5 * time.Second

// startDetached starts the server's supervisor (Supervise) in its own
// session and waits until the server listens (a byte on the ready fd), so
// that when argv (envd) reports the sandbox ready, port 49999 already
// accepts connections.
func startDetached(exe string, serverArgs []string) error {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = os.StartProcess(exe, append([]string{exe, SuperviseFlag}, serverArgs...), &os.ProcAttr{
		Files: []*os.File{devnull, os.Stdout, os.Stderr, w},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	w.Close()
	if err != nil {
		return err
	}
	_ = r.SetReadDeadline(time.Now().Add(serverListenTimeout))
	if _, err := r.Read(make([]byte, 1)); err != nil {
		return fmt.Errorf("server did not report listening: %w", err)
	}
	return nil
}

// openFDs lists the descriptors above stderr that survive exec.
func openFDs() []int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			out = append(out, fd)
		}
	}
	return out
}
