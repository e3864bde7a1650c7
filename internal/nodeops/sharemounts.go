package nodeops

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/cube-dev/cube/internal/hostns"
	"github.com/cube-dev/cube/internal/preflight"
)

// ShareMountsHere makes each directory lie on a shared mount in this
// process's own mount namespace (binding it onto itself when it does not),
// and writes what it did per directory.
func ShareMountsHere(dirs []string, w io.Writer) error {
	res, err := preflight.EnsureShared(dirs)
	for _, r := range res {
		fmt.Fprintf(w, "%s: %s (mount %s)\n", r.Dir, r.Action, r.Mount)
	}
	return err
}

// ShareMountsOnHost is what the chart's init containers run (privileged,
// hostPID): the host directories its volumes mount with mountPropagation:
// Bidirectional must lie on shared mounts in the HOST's mount namespace,
// which the kubelet requires and hosts whose / is private do not give. It
// finds the host's mount namespace (pid 1's, else the container runtime
// shim's, an ancestor of this process) and runs self there through
// nsenter: self is this binary's command line that calls ShareMountsHere
// for dirs.
func ShareMountsOnHost(ctx context.Context, self []string, w, errOut io.Writer) error {
	h, err := hostns.Find("/proc", os.Getpid(), "mnt")
	if err != nil {
		return fmt.Errorf("share mounts: %w", err)
	}
	fmt.Fprintf(w, "host mount namespace: %s\n", h.Path)
	return preflight.RunInMountNS(ctx, h.Path, "/proc/self/exe", self, os.Environ(), w, errOut)
}
