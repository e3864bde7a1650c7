package roles

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
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
