package cgroup

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup/control"
)

// Placing a new process in a cgroup without migrating it. Writing a pid to
// cgroup.procs (MoveAll, AddProc) takes the kernel's global
// cgroup_threadgroup_rwsem for writing, which on a host without
// favordynmods waits for an RCU grace period: ~15 ms p50 on the project's
// VM for the first migration after a quiet moment (later ones within a
// grace period are ~0.05 ms). A cold create paid it for the shim leaving
// the agent's cgroup. Two moves skip that lock: a v1 thread moving itself
// (0 written to tasks) and, on the unified hierarchy, a child cloned
// straight into its cgroup (CLONE_INTO_CGROUP). JoinThread does the first
// and opens the directory for the second; a process forked from that
// thread starts in the cgroup everywhere.

// JoinThread moves the calling OS thread into the cgroup name (relative to
// each hierarchy's root) in every v1 hierarchy, creating it as MoveAll
// does, and returns an fd of name's directory in the unified hierarchy for
// CLONE_INTO_CGROUP (-1 when there is none; the caller closes it). The
// caller must be a locked OS thread that is discarded afterwards (it stays
// in name). On error the thread may be in some hierarchies only: a child
// forked from it then still needs MoveAll.
func JoinThread(name string) (unifiedFD int, err error) {
	if err := validateName("name", name, true); err != nil {
		return -1, err
	}
	l, err := DetectLayout()
	if err != nil {
		return -1, err
	}
	done := map[string]bool{}
	for _, m := range l.V1 {
		d := filepath.Join(m, name)
		if done[d] {
			continue
		}
		done[d] = true
		if err := os.MkdirAll(d, 0o755); err != nil {
			return -1, fmt.Errorf("create cgroup %s: %w", d, err)
		}
		if err := initCpuset(d); err != nil {
			return -1, err
		}
		if err := control.WriteFile(filepath.Join(d, "tasks"), []byte("0")); err != nil {
			return -1, fmt.Errorf("move thread to cgroup %s: %w", d, err)
		}
	}
	if l.Unified == "" {
		return -1, nil
	}
	d := filepath.Join(l.Unified, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return -1, fmt.Errorf("create cgroup %s: %w", d, err)
	}
	fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open cgroup %s: %w", d, err)
	}
	return fd, nil
}

// InAll reports whether this process is in the cgroup name in every
// hierarchy it belongs to (/proc/self/cgroup), so MoveAll would move
// nothing. Unreadable or unexpected content reports false.
func InAll(name string) bool {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return false
	}
	defer f.Close()
	want := path.Clean("/" + name)
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || path.Clean(parts[2]) != want {
			return false
		}
		n++
	}
	return sc.Err() == nil && n > 0
}

// priming is set while a PrimeMigration thread waits.
var priming atomic.Bool

// PrimeMigration starts, on a throwaway thread, the RCU grace period that
// the next cgroup migration on this host waits for, and returns at once.
// The kernel lets writers of cgroup.procs (and of another task's tid to
// tasks) skip that wait for about a grace period after the last one, so a
// migration made soon after (a sandbox's init joining its cgroup while a
// create runs its other steps) finds it over. The thread moves itself into
// name in one v1 hierarchy by its tid (which takes the migration lock, as
// "0" would not) and ends; nothing else moves. Best effort: nothing
// happens without a v1 hierarchy or where name does not exist yet. While
// one primed thread still waits, another call does nothing (a burst of
// creates starts one thread, not one each).
func PrimeMigration(name string) {
	if validateName("name", name, true) != nil || !priming.CompareAndSwap(false, true) {
		return
	}
	started := false
	defer func() {
		if !started {
			priming.Store(false)
		}
	}()
	l, err := DetectLayout()
	if err != nil || len(l.V1) == 0 {
		return
	}
	var dir string
	for _, m := range l.V1 {
		if d := filepath.Join(m, name); dir == "" || d < dir {
			dir = d
		}
	}
	started = true
	go func() {
		defer priming.Store(false)
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if unix.Gettid() == unix.Getpid() {
			// The main thread cannot end; leave it where it is.
			runtime.UnlockOSThread()
			return
		}
		_ = control.WriteFile(filepath.Join(dir, "tasks"), []byte(strconv.Itoa(unix.Gettid())))
	}()
}

// JoinThread moves the calling OS thread into c in every v1 hierarchy of
// the sandbox controllers (0 written to tasks: no migration lock, no RCU
// grace period) and returns an fd of c's unified directory for
// CLONE_INTO_CGROUP on v2 (-1 on v1; the caller closes it). A process the
// thread forks next starts in c, so nothing migrates it. The caller must
// be a locked OS thread, and moves itself back (JoinThread of the cgroup it
// came from) before it runs anything that must not count against c. On
// error the thread may be in some hierarchies only.
func (c *Cgroup) JoinThread() (unifiedFD int, err error) {
	if c.layout.Version == V2 {
		d := c.dirs["unified"]
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("open cgroup %s: %w", d, err)
		}
		return fd, nil
	}
	for _, d := range uniqueDirs(c.dirs) {
		if err := control.WriteFile(filepath.Join(d, "tasks"), []byte("0")); err != nil {
			return -1, fmt.Errorf("move thread to cgroup %s: %w", d, err)
		}
	}
	return -1, nil
}

// LeaveThread moves the calling OS thread, which c.JoinThread moved into
// c, back into the cgroup name (relative to each hierarchy's root) in the
// hierarchies JoinThread moved it in: "0" written to tasks, as there. It
// neither creates name nor parses mountinfo again (JoinThread(name) does
// both, ~0.4 ms per shim start on a quiet node, and the parse grows with
// the host's mounts: one netns pin per sandbox): name must exist in those
// hierarchies, as the cgroup the thread came from does. On cgroup v2
// JoinThread moves nothing, and neither does LeaveThread.
func (c *Cgroup) LeaveThread(name string) error {
	if err := validateName("name", name, true); err != nil {
		return err
	}
	if c.layout.Version == V2 {
		return nil
	}
	for _, d := range uniqueDirs(c.layout.dirs(name)) {
		if err := control.WriteFile(filepath.Join(d, "tasks"), []byte("0")); err != nil {
			return fmt.Errorf("move thread to cgroup %s: %w", d, err)
		}
	}
	return nil
}
