package roles

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return (err == nil || errors.Is(err, syscall.EPERM)) && !zombie(pid)
}

// zombie reports whether pid has exited and waits to be reaped: a cube up
// killed by SIGKILL stays one until its parent reaps it, and must not
// stop the next start (seen restarting over 2000 sandboxes from a shell).
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// StopAllInOne signals the `cube up` running on dataDir to stop and waits
// for it to exit.
func StopAllInOne(dataDir string, timeout time.Duration) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "cube.pid"))
	if err != nil {
		return fmt.Errorf("no cube running on %s (no pid file)", dataDir)
	}
	pid, err := strconv.Atoi(string(trimNL(b)))
	if err != nil || !processAlive(pid) {
		return fmt.Errorf("no cube running on %s", dataDir)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal cube (pid %d): %w", pid, err)
	}
	deadline := time.Now().Add(timeout)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("cube (pid %d) did not stop within %s", pid, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
