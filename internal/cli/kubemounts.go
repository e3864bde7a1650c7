package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/cube-dev/cube/internal/hostns"
	"github.com/cube-dev/cube/internal/preflight"
)

// shareMounts is `cube kube share-mounts`: the chart's init containers run
// it (privileged, hostPID) so that the host directories its volumes mount
// with mountPropagation: Bidirectional lie on shared mounts in the HOST's
// mount namespace, which the kubelet requires and hosts whose / is private
// do not give. It finds the host's mount namespace (pid 1's, else the
// container runtime shim's, an ancestor of this process) and re-runs
// itself there with --here through nsenter. With --here it works in its own
// mount namespace (also for running it on the host by hand).
func shareMounts(ctx context.Context, stdout, stderr io.Writer, dirs []string, here bool) error {
	if here {
		res, err := preflight.EnsureShared(dirs)
		for _, r := range res {
			fmt.Fprintf(stdout, "%s: %s (mount %s)\n", r.Dir, r.Action, r.Mount)
		}
		return err
	}
	h, err := hostns.Find("/proc", os.Getpid(), "mnt")
	if err != nil {
		return fmt.Errorf("share mounts: %w", err)
	}
	fmt.Fprintf(stdout, "host mount namespace: %s\n", h.Path)
	args := []string{"kube", "share-mounts", "--here"}
	for _, d := range dirs {
		args = append(args, "--dir="+d)
	}
	return preflight.RunInMountNS(ctx, h.Path, "/proc/self/exe", args, os.Environ(), stdout, stderr)
}
