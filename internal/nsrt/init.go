package nsrt

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// InitMain is the body of `cube sandbox-init --state-dir DIR`; args are the
// arguments after the subcommand. It runs as pid 1 of the sandbox's new
// namespaces, started by the shim in the sandbox cgroup: it waits for the
// shim's release (with the sandbox disk's mount, see initsync.go), builds
// the root filesystem, pivots into it, drops
// privileges (capabilities, no_new_privs, seccomp; see harden.go) and execs
// the spec's init with the ready pipe on fd 3. Errors go to stderr (the
// init log) and end the process with status 1.
func InitMain(args []string) int {
	// Namespace operations (unshare) apply to the calling thread only.
	runtime.LockOSThread()
	if len(args) > 0 {
		switch args[0] {
		case usernsChildFlag: // the workload's process in its user namespace
			if err := usernsChildMain(); err != nil {
				fmt.Fprintf(os.Stderr, "sandbox-init: workload: %v\n", err)
			}
			return 1
		}
	}
	if err := initMain(args); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: %v\n", err)
		return 1
	}
	return 0 // not reached: initMain execs
}

func initMain(args []string) (err error) {
	fs := flag.NewFlagSet(InitCommand, flag.ContinueOnError)
	stateDir := fs.String("state-dir", "", "sandbox state directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Getpid() != 1 {
		return errors.New("must run as pid 1 of a new pid namespace (it is started by the shim)")
	}
	spec, err := readSpec(*stateDir)
	if err != nil {
		return err
	}
	spec = spec.withDefaults()
	if err := makeMountsPrivate(); err != nil {
		return err
	}
	// With a user namespace the workload's process starts first (see
	// userns.go); it is collected once pid 1 is in the sandbox cgroup.
	var started <-chan childResult
	var child *usernsChild
	if spec.UserNS != nil {
		if started, err = startUsernsChildAsync(spec.UserNS, nsexecPath(spec)); err != nil {
			return err
		}
		defer func() {
			if started != nil { // failed before collecting it
				if r := <-started; r.child != nil {
					r.child.abort()
				}
			} else if err != nil && child != nil {
				child.abort()
			}
		}()
	}
	// Wait for the shim: its message says the init is in the sandbox
	// cgroup and carries the disk's mount; EOF means "give up".
	syncSock := os.NewFile(syncFD, "sync")
	how, disk, err := recvSync(syncSock)
	syncSock.Close()
	if err != nil {
		return err
	}
	if disk != nil {
		defer disk.Close()
	}
	// Only now, inside the sandbox cgroup, can a cgroup namespace root there.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: no cgroup namespace: %v\n", err)
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	layer, err := prepareLayer(spec, disk)
	if err != nil {
		return err
	}
	if disk != nil {
		// Attached. Without Spec.Reaper pid 1 reaps in this process
		// (runUserNS), where no exec would close it.
		disk.Close()
	}
	if started != nil {
		r := <-started
		started = nil
		if r.err != nil {
			return r.err
		}
		child = r.child
		if how == syncMoved {
			// Born before the init was moved: it is still outside.
			if err := child.joinCgroup(spec); err != nil {
				return err
			}
		}
	}
	if err := setupRoot(spec, layer, child); err != nil {
		return err
	}
	argv0, err := lookPath(spec.Args[0], spec.Env)
	if err != nil {
		return err
	}
	if child != nil {
		return runUserNS(spec, child, argv0)
	}
	if err := dropPrivileges(SandboxCapabilities, spec.Seccomp); err != nil {
		return err
	}
	if err := unix.Exec(argv0, spec.Args, spec.Env); err != nil {
		return fmt.Errorf("exec %s: %w", argv0, err)
	}
	return nil
}

// lookPath resolves a command name in the PATH of env (inside the new root).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := DefaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("init command %q not found in PATH %s", name, path)
}
