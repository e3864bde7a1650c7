package nodecontroller

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/cube-dev/cube/internal/errdefs"
)

// DefaultSelector selects the Nodes of the dedicated compute pool (the
// chart's placement.compute.nodeSelector).
const DefaultSelector = "cube.dev/compute=true"

// Name is the controller's name: Lease, event source, field manager.
const Name = "cube-node-controller"

// Options configure Run.
type Options struct {
	Cube Cube
	// Selector picks the managed Nodes (label selector syntax);
	// default DefaultSelector.
	Selector string
	// LeaderElection runs the controller on one replica at a time, holding
	// the Lease Name in LeaderElectionNamespace.
	LeaderElection          bool
	LeaderElectionNamespace string
	// MetricsAddr and HealthAddr are listen addresses; "0" or "" disables.
	MetricsAddr string
	HealthAddr  string
	// Resync is how often an idle Node is compared with Cube again
	// (default 1m).
	Resync time.Duration
	Log    *slog.Logger
	// Reconciled, if set, is called with the Node's name after every
	// reconcile, whatever its outcome. A test that must show the
	// controller left something alone waits for a reconcile instead of
	// sleeping; it must not block.
	Reconciled func(node string)
}

// Run runs the controller until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	if o.Cube == nil {
		return fmt.Errorf("node controller needs a cube client: %w", errdefs.ErrInvalidArgument)
	}
	if o.Selector == "" {
		o.Selector = DefaultSelector
	}
	sel, err := labels.Parse(o.Selector)
	if err != nil {
		return fmt.Errorf("node selector %q: %v: %w", o.Selector, err, errdefs.ErrInvalidArgument)
	}
	if sel.Empty() {
		return fmt.Errorf("node selector %q selects every Node: name the compute pool's label: %w", o.Selector, errdefs.ErrInvalidArgument)
	}
	if o.LeaderElection && o.LeaderElectionNamespace == "" {
		return fmt.Errorf("leader election needs a namespace (--leader-election-namespace or POD_NAMESPACE): %w", errdefs.ErrInvalidArgument)
	}
	if o.Resync <= 0 {
		o.Resync = time.Minute
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	if o.HealthAddr == "0" {
		o.HealthAddr = ""
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("node controller scheme: %w", err)
	}
	lg := logr.FromSlogHandler(o.Log.Handler())
	ctrl.SetLogger(lg) // controller-runtime's packages log through this global
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                        scheme,
		Logger:                        lg,
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              Name,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.HealthAddr,
		// One controller per process in production; tests start several.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return fmt.Errorf("node controller manager: %v: %w", err, errdefs.ErrUnavailable)
	}
	if o.HealthAddr != "" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return fmt.Errorf("node controller health check: %w", err)
		}
		if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
			return fmt.Errorf("node controller ready check: %w", err)
		}
	}
	r := &Reconciler{
		Client:   mgr.GetClient(),
		Cube:     o.Cube,
		Selector: sel,
		Events:   mgr.GetEventRecorder(Name),
		Resync:   o.Resync,
		Log:      o.Log,

		Reconciled: o.Reconciled,
	}
	err = ctrl.NewControllerManagedBy(mgr).
		Named(Name).
		For(&corev1.Node{}).
		WithEventFilter(r.predicates()).
		Complete(r)
	if err != nil {
		return fmt.Errorf("node controller: %w", err)
	}
	o.Log.Info("node controller starting", "selector", o.Selector, "leaderElection", o.LeaderElection)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("node controller: %w", err)
	}
	return nil
}
