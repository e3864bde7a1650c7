package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodecontroller"
)

// runKubeAll is `cube kube`: node-controller here, the chart's other
// verbs in kube.go.
func runKubeAll(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"usage: cube kube hostnet-preflight|wait-prep|install-artifacts|stop-cubelet|node-controller ..."}
	}
	if args[0] == "node-controller" {
		return runNodeController(ctx, args[1:], stderr)
	}
	return runKube(ctx, args, stdout, stderr)
}

// runNodeController implements `cube kube node-controller`: Kubernetes
// cordon/uncordon, the cube.dev/drain annotation and Node deletion applied
// to the Cube nodes of the same name (see docs/kubernetes.md).
func runNodeController(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlagSet("kube node-controller", stderr)
	server := fs.String("server", envDefault("CUBE_SERVER", "http://127.0.0.1:3000"), "URL of the cube server (env CUBE_SERVER)")
	key := fs.String("api-key", os.Getenv("CUBE_API_KEY"), "API key (env CUBE_API_KEY)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
	selector := fs.String("node-selector", nodecontroller.DefaultSelector, "label selector of the Nodes to manage")
	elect := fs.Bool("leader-elect", true, "hold the Lease "+nodecontroller.Name+" so one replica acts at a time")
	ns := fs.String("leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the Lease (env POD_NAMESPACE)")
	metrics := fs.String("metrics-addr", "0", "Prometheus metrics listen address (0: off)")
	health := fs.String("health-addr", ":8081", "/healthz and /readyz listen address (0: off)")
	resync := fs.Duration("resync", 0, "how often an idle Node is compared with Cube again (0: 1m)")
	logLevel := fs.String("log-level", envDefault("CUBE_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usageError{"usage: cube kube node-controller --server URL --api-key KEY [--kubeconfig FILE]"}
	}
	cube, err := nodecontroller.NewHTTPCube(*server, *key, nil)
	if err != nil {
		return usageError{err.Error()}
	}
	cfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		return err
	}
	return nodecontroller.Run(ctx, cfg, nodecontroller.Options{
		Cube:                    cube,
		Selector:                *selector,
		LeaderElection:          *elect,
		LeaderElectionNamespace: *ns,
		MetricsAddr:             *metrics,
		HealthAddr:              *health,
		Resync:                  *resync,
		Log:                     newLogger(stderr, *logLevel),
	})
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
