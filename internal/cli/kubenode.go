package cli

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodecontroller"
)

func newNodeControllerCmd() *cobra.Command {
	var server, key, kubeconfig string
	var logLevel slog.Level
	opts := nodecontroller.Options{}
	c := &cobra.Command{
		Use:   "node-controller",
		Short: "apply Kubernetes cordon/uncordon, the cube.dev/drain annotation and Node deletion to the Cube nodes of the same name",
		Long: `Apply Kubernetes cordon/uncordon, the cube.dev/drain annotation and Node
deletion to the Cube nodes of the same name (see docs/kubernetes/node-operations.md).`,
		Args: exactArgs(0, "usage: cube kube node-controller --server URL --api-key KEY [--kubeconfig FILE]"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cube, err := nodecontroller.NewHTTPCube(server, key, nil)
			if err != nil {
				return usageError{err.Error()}
			}
			cfg, err := kubeConfig(kubeconfig)
			if err != nil {
				return err
			}
			opts.Cube = cube
			opts.Log = newLogger(cmd.ErrOrStderr(), logLevel)
			return nodecontroller.Run(cmd.Context(), cfg, opts)
		},
	}
	addServerFlags(c, &server, &key)
	fs := c.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&opts.Selector, "node-selector", nodecontroller.DefaultSelector, "label selector of the Nodes to manage")
	fs.BoolVar(&opts.LeaderElection, "leader-elect", true, "hold the Lease "+nodecontroller.Name+" so one replica acts at a time")
	fs.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the Lease")
	bindEnv(fs, "leader-election-namespace", "POD_NAMESPACE")
	fs.StringVar(&opts.MetricsAddr, "metrics-addr", "0", "Prometheus metrics listen address (0: off)")
	fs.StringVar(&opts.HealthAddr, "health-addr", ":8081", "/healthz and /readyz listen address (0: off)")
	fs.DurationVar(&opts.Resync, "resync", 0, "how often an idle Node is compared with Cube again (0: 1m)")
	addLogLevel(fs, &logLevel, slog.LevelInfo)
	return c
}

// newReleaseNodesCmd is `cube kube release-nodes`: remove the node
// controller's finalizer, drain-status annotation and Node conditions from
// every Node matching the selector (the chart's pre-delete hook runs it).
// With --stop-deployment it first deletes the controller's Deployment and
// waits for its Pods to end, so nothing adds the finalizer back. It never
// talks to Cube's server.
func newReleaseNodesCmd() *cobra.Command {
	var kubeconfig, selector, stop, ns string
	var timeout time.Duration
	var logLevel slog.Level
	const usage = "usage: cube kube release-nodes [--kubeconfig FILE] [--node-selector SEL] [--stop-deployment NAME --namespace NS]"
	c := &cobra.Command{
		Use:   "release-nodes",
		Short: "remove the node controller's finalizer, annotation and conditions from the compute pool's Nodes (helm uninstall)",
		Args:  exactArgs(0, usage),
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := labels.Parse(selector)
			if err != nil {
				return usageError{fmt.Sprintf("--node-selector %q: %v", selector, err)}
			}
			if sel.Empty() {
				return usageError{fmt.Sprintf("--node-selector %q selects every Node: name the compute pool's label", selector)}
			}
			if stop != "" && ns == "" {
				return usageError{"--stop-deployment needs --namespace (or POD_NAMESPACE)"}
			}
			cfg, err := kubeConfig(kubeconfig)
			if err != nil {
				return err
			}
			c, err := client.New(cfg, client.Options{})
			if err != nil {
				return fmt.Errorf("kubernetes client: %v: %w", err, errdefs.ErrUnavailable)
			}
			ctx, out := cmd.Context(), cmd.OutOrStdout()
			log := newLogger(cmd.ErrOrStderr(), logLevel)
			if stop != "" {
				key := types.NamespacedName{Namespace: ns, Name: stop}
				if err := nodecontroller.StopDeployment(ctx, c, key, timeout, log); err != nil {
					return fmt.Errorf("stop the node controller before releasing nodes: %w", err)
				}
				fmt.Fprintf(out, "deployment %s: gone\n", key)
			}
			nodes, err := nodecontroller.Release(ctx, c, sel, log)
			released := 0
			for _, n := range nodes {
				fmt.Fprintln(out, n.String())
				if n.Changed() {
					released++
				}
			}
			fmt.Fprintf(out, "release-nodes: %d Nodes match %q, %d released\n", len(nodes), sel.String(), released)
			return err
		},
	}
	fs := c.Flags()
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
	fs.StringVar(&selector, "node-selector", nodecontroller.DefaultSelector, "label selector of the Nodes to release")
	fs.StringVar(&stop, "stop-deployment", "", "first delete this Deployment (the node controller) in --namespace and wait until it is gone")
	fs.StringVar(&ns, "namespace", "", "namespace of --stop-deployment")
	bindEnv(fs, "namespace", "POD_NAMESPACE")
	fs.DurationVar(&timeout, "stop-timeout", 2*time.Minute, "how long to wait for --stop-deployment to be gone")
	addLogLevel(fs, &logLevel, slog.LevelInfo)
	return c
}

// kubeConfig is the explicit kubeconfig, else the in-cluster config, else
// $KUBECONFIG or ~/.kube/config.
func kubeConfig(path string) (*rest.Config, error) {
	if path == "" && os.Getenv("KUBECONFIG") == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: not in a cluster and no usable kubeconfig (%v): pass --kubeconfig: %w", err, errdefs.ErrInvalidArgument)
	}
	return cfg, nil
}
