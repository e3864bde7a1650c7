package nodeops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// proc is what StopCubelet knows of a process.
type proc struct {
	pid   int
	argv  []string
	mntNS string
}

// StopCubelet is the cube-node Pod's preStop: it sends SIGTERM to `cube
// cubelet` in this container only (found in procDir, normally /proc) and
// waits up to timeout for it to exit. It signals by pid, never a process
// group, so shims and sandboxes (other argv, other mount namespaces) are
// not touched and keep running for the next cubelet to adopt.
func StopCubelet(ctx context.Context, w io.Writer, procDir string, timeout time.Duration) error {
	self, err := os.Readlink(filepath.Join(procDir, "self", "ns", "mnt"))
	if err != nil {
		return fmt.Errorf("stop cubelet: %w", err)
	}
	pids := cubeletTargets(listProcs(procDir), os.Getpid(), self)
	if len(pids) == 0 {
		_, err := fmt.Fprintln(w, "no cubelet running in this container")
		return err
	}
	return terminate(ctx, w, procDir, pids, timeout)
}

// cubeletTargets picks the processes a preStop may signal: `cube cubelet`
// in the caller's own mount namespace (its container), never itself, never
// a shim or a sandbox (other argv or other namespaces).
func cubeletTargets(procs []proc, self int, selfMntNS string) []int {
	var out []int
	for _, p := range procs {
		if p.pid == self || p.mntNS != selfMntNS || len(p.argv) < 2 {
			continue
		}
		if filepath.Base(p.argv[0]) == "cube" && p.argv[1] == "cubelet" {
			out = append(out, p.pid)
		}
	}
	return out
}

// listProcs reads every process's argv and mount namespace; processes that
// end while it reads (or that it may not read) are left out.
func listProcs(procDir string) []proc {
	ents, _ := os.ReadDir(procDir)
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join(procDir, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		ns, err := os.Readlink(filepath.Join(procDir, e.Name(), "ns", "mnt"))
		if err != nil {
			continue
		}
		out = append(out, proc{pid: pid, argv: strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00"), mntNS: ns})
	}
	return out
}

// terminate sends SIGTERM to each pid and waits until all have exited
// (or are zombies: their parent, not us, reaps them).
func terminate(ctx context.Context, w io.Writer, procDir string, pids []int, timeout time.Duration) error {
	for _, pid := range pids {
		if err := unix.Kill(pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("stop cubelet: signal %d: %w", pid, err)
		}
		fmt.Fprintf(w, "sent SIGTERM to cubelet pid %d\n", pid)
	}
	deadline := time.Now().Add(timeout)
	for _, pid := range pids {
		for unix.Kill(pid, 0) == nil && !isZombie(procDir, pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("stop cubelet: pid %d still running after %s: %w", pid, timeout, errdefs.ErrUnavailable)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

func isZombie(procDir string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && strings.HasPrefix(rest, "Z")
}
