package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/hostnetgate"
	"github.com/cube-dev/cube/internal/nodeops"
	"github.com/cube-dev/cube/internal/preflight"
)

// newKubeCmd is `cube kube`: the commands the Helm chart's Pods run (see
// docs/kubernetes/).
func newKubeCmd() *cobra.Command {
	return group("kube", "commands the Helm chart runs: hostnet-preflight, wait-prep, install-artifacts, share-mounts, stop-cubelet, node-controller, release-nodes",
		newHostnetPreflightCmd(), newWaitPrepCmd(), newInstallArtifactsCmd(), newShareMountsCmd(), newStopCubeletCmd(),
		newNodeControllerCmd(), newReleaseNodesCmd())
}

func newHostnetPreflightCmd() *cobra.Command {
	var ns, name string
	var desired, ack bool
	c := &cobra.Command{
		Use:   "hostnet-preflight",
		Short: "refuse a release that flips cubeNode.hostNetwork on running nodes without cubeNode.hostNetworkChangeAck",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ns == "" {
				return usageError{"--namespace is required"}
			}
			cfg, err := rest.InClusterConfig()
			if err != nil {
				return fmt.Errorf("hostnet preflight: in-cluster config: %v: %w", err, errdefs.ErrUnavailable)
			}
			k, err := hostnetgate.NewKube(cfg)
			if err != nil {
				return err
			}
			d, err := hostnetgate.Run(cmd.Context(), k, ns, name, desired, ack)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), d.Message)
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&ns, "namespace", "", "namespace of the DaemonSet")
	bindEnv(fs, "namespace", "POD_NAMESPACE")
	fs.StringVar(&name, "daemonset", "cube-node", "DaemonSet name")
	fs.BoolVar(&desired, "desired", true, "hostNetwork value of the release being applied")
	fs.BoolVar(&ack, "ack", false, "cubeNode.hostNetworkChangeAck")
	return c
}

func newWaitPrepCmd() *cobra.Command {
	var genFile, dir string
	var require []string
	var timeout, every time.Duration
	c := &cobra.Command{
		Use:   "wait-prep",
		Short: "wait until this node is prepared for the current prep generation (and --require files exist)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return nodeops.WaitPrep(cmd.Context(), cmd.OutOrStdout(), genFile, dir, require, timeout, every)
		},
	}
	fs := c.Flags()
	fs.StringVar(&genFile, "generation-file", "/etc/cube/prep/generation", "file holding the current prep generation (a ConfigMap key)")
	fs.StringVar(&dir, "dir", "/var/lib/cube/prep", "directory of the fingerprints")
	fs.StringArrayVar(&require, "require", nil, "a file that must exist too (e.g. the installed envd); repeatable")
	fs.DurationVar(&timeout, "timeout", 0, "give up after this long (0: wait forever)")
	fs.DurationVar(&every, "interval", 2*time.Second, "poll interval")
	return c
}

func newInstallArtifactsCmd() *cobra.Command {
	var from, to string
	var hold bool
	c := &cobra.Command{
		Use:   "install-artifacts",
		Short: "copy envd and the shim binaries from the installer image to the host",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			arts, changed, err := preflight.InstallArtifacts(from, to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "installed %d artifacts into %s (%d changed)\n", len(arts), to, changed)
			if hold {
				<-cmd.Context().Done()
			}
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&from, "from", "/opt/cube/artifacts", "artifacts in the installer image")
	fs.StringVar(&to, "to", "/var/lib/cube/artifacts", "host directory cubelet reads them from")
	fs.BoolVar(&hold, "hold", false, "after installing, wait until terminated")
	return c
}

// newShareMountsCmd is `cube kube share-mounts`: the chart's init
// containers run it so that the host directories its Bidirectional volumes
// mount lie on shared mounts in the host's mount namespace (see
// nodeops.ShareMountsOnHost). With --here it works in its own mount
// namespace (also for running it on the host by hand).
func newShareMountsCmd() *cobra.Command {
	var dirs []string
	var here bool
	const usage = "usage: cube kube share-mounts --dir DIR [--dir DIR ...] [--here]"
	c := &cobra.Command{
		Use:   "share-mounts --dir DIR [--dir DIR ...]",
		Short: "make host directories lie on shared mounts in the host's mount namespace",
		Args:  exactArgs(0, usage),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(dirs) == 0 {
				return usageError{usage}
			}
			if here {
				return nodeops.ShareMountsHere(dirs, cmd.OutOrStdout())
			}
			self := []string{"kube", "share-mounts", "--here"}
			for _, d := range dirs {
				self = append(self, "--dir="+d)
			}
			return nodeops.ShareMountsOnHost(cmd.Context(), self, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	c.Flags().StringArrayVar(&dirs, "dir", nil, "host directory that must lie on a shared mount (created if missing); repeatable")
	c.Flags().BoolVar(&here, "here", false, "work in this process's own mount namespace (on the host itself); default: find the host's from a hostPID Pod")
	return c
}

func newStopCubeletCmd() *cobra.Command {
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "stop-cubelet",
		Short: "preStop: SIGTERM the cubelet of this container only and wait for it to exit (sandboxes keep running)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return nodeops.StopCubelet(cmd.Context(), cmd.OutOrStdout(), "/proc", timeout)
		},
	}
	c.Flags().DurationVar(&timeout, "timeout", 25*time.Second, "how long to wait for cubelet to exit")
	return c
}
