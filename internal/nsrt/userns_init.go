package nsrt

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/envd/reaper"
)

// reaperCapabilities are all pid 1 keeps once the workload runs in a user
// namespace: none, it only reaps (it forwards no signal, see package
// reaper).
var reaperCapabilities []uintptr

// runUserNS is pid 1's last step with a user namespace: the root is ready,
// so it releases the workload (argv0 resolved in the new root) and becomes
// the sandbox's reaper, in the host's user namespace with no capability:
// it execs Spec.Reaper or, without one, reaps in this process (exiting
// with the workload's status). It returns only errors.
//
// Reaping here in every sandbox would save the reaper's exec and Go start
// (~2.5 ms of CPU per create) but costs each sandbox its whole life ~1.2
// MiB more memory (sandbox-init's binary, whose package initialisation
// dirties far more than cube-reaper's) and a thread: measured and dropped
// (docs/benchmarks.md).
func runUserNS(spec Spec, child *usernsChild, argv0 string) error {
	pid := child.cmd.Process.Pid
	var reaperPath string
	if len(spec.Reaper) > 0 {
		var err error
		if reaperPath, err = lookPath(spec.Reaper[0], spec.Env); err != nil {
			return fmt.Errorf("reaper: %w", err)
		}
	}
	if err := child.run(execRequest{Path: argv0, Args: spec.Args, Env: spec.Env, Seccomp: spec.Seccomp}); err != nil {
		return err
	}
	if reaperPath == "" {
		// What the sandbox sees of pid 1: no host path.
		if name, err := unix.BytePtrFromString(reaperName); err == nil {
			_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
		}
		hideArgs()
		// No exec follows: every thread drops its capabilities, or, in
		// a binary built with cgo, the reaping one only.
		err := dropPrivilegesAllThreads(reaperCapabilities, spec.Seccomp)
		if errors.Is(err, errAllThreads) {
			err = dropPrivileges(reaperCapabilities, spec.Seccomp)
		}
		if err != nil {
			return err
		}
		reapHere(pid)
	}
	// The locked thread drops its capabilities and installs seccomp with
	// no_new_privs on every thread; an exec leaves only this thread's set.
	if err := dropPrivileges(reaperCapabilities, spec.Seccomp); err != nil {
		return err
	}
	if err := unix.Exec(reaperPath, spec.Reaper, reaperEnv(spec.Env, pid)); err != nil {
		return fmt.Errorf("exec reaper %s: %w", reaperPath, err)
	}
	return nil
}

// reaperEnv is the exec'd reaper's environment: env, the workload's pid
// and GOMAXPROCS=1 for a reaper in Go (envd's own pid-1 mode, where the
// node has no cube-reaper, which is C and ignores it). A reaper blocked in
// wait4 needs no parallelism, and with one P the Go runtime keeps ~3.5
// threads instead of ~4.1 for the sandbox's whole life (each a task against
// pid_max) and ~100 KiB less memory (measured, docs/benchmarks.md).
// It starts no process, so the setting goes no further.
func reaperEnv(env []string, pid int) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			out = append(out, kv)
		}
	}
	return append(out, ReapPIDEnv+"="+strconv.Itoa(pid), "GOMAXPROCS=1")
}

// reaperName is pid 1's command name once it only reaps, the same as the
// reaper bound at /.cube/reaper gets (sandbox-init's is "exe").
const reaperName = "reaper"

// reapHere reaps until the workload pid exits, then exits with its status.
// The memory sandbox-init used is given back first (it would stay for the
// sandbox's life), with one P: the reaper needs no parallelism, and the Go
// runtime then makes no more threads for it (it never ends idle ones).
func reapHere(pid int) {
	runtime.GOMAXPROCS(1)
	debug.FreeOSMemory()
	code, err := reaper.Adopt(pid)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: reap: %v\n", err)
	}
	os.Exit(code)
}

// hideArgs turns pid 1's command line, which the sandbox can read in its
// /proc, into reaperName: sandbox-init's names host paths (its binary, the
// state dir). It overwrites the kernel's argument area in place, as
// setproctitle does: os.Args point into it, and nothing reads them after
// this. It leaves them alone unless they lie back to back there.
func hideArgs() {
	if len(os.Args) == 0 || len(os.Args[0]) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.StringData(os.Args[0])))
	end := start
	for _, a := range os.Args {
		if len(a) == 0 || uintptr(unsafe.Pointer(unsafe.StringData(a))) != end {
			return
		}
		end += uintptr(len(a)) + 1 // and its NUL
	}
	area := unsafe.Slice(unsafe.StringData(os.Args[0]), end-1-start) // the last NUL stays
	clear(area)
	copy(area, reaperName)
}
