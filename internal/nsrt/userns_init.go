package nsrt

import (
	"fmt"
	"os"
	"slices"
	"strconv"

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
	// The locked thread drops its capabilities and installs seccomp with
	// no_new_privs on every thread; an exec leaves only this thread's set.
	if err := dropPrivileges(reaperCapabilities, spec.Seccomp); err != nil {
		return err
	}
	if reaperPath == "" {
		code, err := reaper.Adopt(pid)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-init: reap: %v\n", err)
		}
		os.Exit(code)
	}
	env := append(slices.Clip(spec.Env), ReapPIDEnv+"="+strconv.Itoa(pid))
	if err := unix.Exec(reaperPath, spec.Reaper, env); err != nil {
		return fmt.Errorf("exec reaper %s: %w", reaperPath, err)
	}
	return nil
}
