package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodecontroller"
)

// runKubeAll is `cube kube`: node-controller and release-nodes here, the
// chart's other verbs in kube.go.
func runKubeAll(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"usage: cube kube " + kubeVerbs + " ..."}
	}
	switch args[0] {
	case "node-controller":
		return runNodeController(ctx, args[1:], stderr)
	case "release-nodes":
		return runReleaseNodes(ctx, args[1:], stdout, stderr)
	}
	return runKube(ctx, args, stdout, stderr)
}

// runNodeController implements `cube kube node-controller`: Kubernetes
// cordon/uncordon, the cube.dev/drain annotation and Node deletion applied
// to the Cube nodes of the same name (see docs/kubernetes/node-operations.md).
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
	if err := parseFlags(fs, args); err != nil {
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

// runReleaseNodes implements `cube kube release-nodes`: remove the node
// controller's finalizer, drain-status annotation and Node conditions from
// every Node matching the selector (the chart's pre-delete hook runs it).
// With --stop-deployment it first deletes the controller's Deployment and
// waits for its Pods to end, so nothing adds the finalizer back. It never
// talks to Cube's server.
func runReleaseNodes(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("kube release-nodes", stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
	selector := fs.String("node-selector", nodecontroller.DefaultSelector, "label selector of the Nodes to release")
	stop := fs.String("stop-deployment", "", "first delete this Deployment (the node controller) in --namespace and wait until it is gone")
	ns := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace of --stop-deployment (env POD_NAMESPACE)")
	timeout := fs.Duration("stop-timeout", 2*time.Minute, "how long to wait for --stop-deployment to be gone")
	logLevel := fs.String("log-level", envDefault("CUBE_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	const usage = "usage: cube kube release-nodes [--kubeconfig FILE] [--node-selector SEL] [--stop-deployment NAME --namespace NS]"
	if fs.NArg() != 0 {
		return usageError{usage}
	}
	sel, err := labels.Parse(*selector)
	if err != nil {
		return usageError{fmt.Sprintf("--node-selector %q: %v", *selector, err)}
	}
	if sel.Empty() {
		return usageError{fmt.Sprintf("--node-selector %q selects every Node: name the compute pool's label", *selector)}
	}
	if *stop != "" && *ns == "" {
		return usageError{"--stop-deployment needs --namespace (or POD_NAMESPACE)"}
	}
	cfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("kubernetes client: %v: %w", err, errdefs.ErrUnavailable)
	}
	log := newLogger(stderr, *logLevel)
	if *stop != "" {
		key := types.NamespacedName{Namespace: *ns, Name: *stop}
		if err := nodecontroller.StopDeployment(ctx, c, key, *timeout, log); err != nil {
			return fmt.Errorf("stop the node controller before releasing nodes: %w", err)
		}
		fmt.Fprintf(stdout, "deployment %s: gone\n", key)
	}
	nodes, err := nodecontroller.Release(ctx, c, sel, log)
	released := 0
	for _, n := range nodes {
		fmt.Fprintln(stdout, n.String())
		if n.Changed() {
			released++
		}
	}
	fmt.Fprintf(stdout, "release-nodes: %d Nodes match %q, %d released\n", len(nodes), sel.String(), released)
	return err
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
