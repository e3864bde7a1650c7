// Package nodecontroller keeps Cube's node registry in step with Kubernetes
// Nodes: kubectl cordon isolates the Cube node of the same name, uncordon
// makes it schedulable again, the cube.dev/drain annotation drains it (with
// progress written back to cube.dev/drain-status and to the Node conditions
// CubeDrain and CubeSchedulable), and deleting the Node drains and
// deregisters it. Only Nodes matching a label selector are managed; a
// finalizer makes deletions observable.
package nodecontroller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Reconciler reconciles one Node with its Cube node (cubelet identity =
// Node name = spec.nodeName of the cube-node Pod).
type Reconciler struct {
	Client   client.Client
	Cube     Cube
	Selector labels.Selector
	Events   recorder.EventRecorder // may be nil
	Resync   time.Duration
	Log      *slog.Logger
	// Reconciled, if set, is called after every reconcile of a Node,
	// whatever its outcome (see Options.Reconciled).
	Reconciled func(node string)
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// Reconcile applies one Node's cordon, drain annotation and deletion to
// Cube and writes drain progress back.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if r.Reconciled != nil {
		defer r.Reconciled(req.Name)
	}
	var node corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	log := r.Log.With("node", node.Name)
	hasFinalizer := controllerutil.ContainsFinalizer(&node, Finalizer)
	if !r.Selector.Matches(labels.Set(node.Labels)) {
		if hasFinalizer { // the label was removed: let go of the Node, leave Cube alone
			log.Info("node no longer managed; removing finalizer and conditions")
			// Conditions first: while the finalizer is there, a failure is retried.
			if err := r.patchConditions(ctx, &node, nil, staleConditions(node.Status.Conditions)); err != nil {
				return reconcile.Result{}, err
			}
			return reconcile.Result{}, r.patch(ctx, &node, "", true)
		}
		return reconcile.Result{}, nil
	}
	if node.DeletionTimestamp != nil && !hasFinalizer {
		return reconcile.Result{}, nil // deleted before we managed it
	}
	if node.DeletionTimestamp == nil && !hasFinalizer {
		orig := node.DeepCopy()
		controllerutil.AddFinalizer(&node, Finalizer)
		if err := r.Client.Patch(ctx, &node, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return reconcile.Result{}, fmt.Errorf("add finalizer to node %s: %w", node.Name, err)
		}
	}

	w := wantOf(&node)
	st, found, err := r.status(ctx, node.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	p := decide(w, found, st)
	for _, a := range p.Actions {
		if err := r.do(ctx, node.Name, a, p.Drain); err != nil {
			r.event(&node, corev1.EventTypeWarning, "CubeActionFailed", string(a), err.Error())
			return reconcile.Result{}, err
		}
		if a == actDrain {
			log.Info("cube node updated", "action", string(a), "policy", string(p.Drain.Policy), "grace", p.Drain.Grace)
		} else {
			log.Info("cube node updated", "action", string(a))
		}
		r.event(&node, corev1.EventTypeNormal, a.reason(), string(a), "cube node "+string(a))
	}
	if p.RemoveFinalizer {
		return reconcile.Result{}, r.patch(ctx, &node, "", true)
	}
	if len(p.Actions) > 0 { // show the effect, not the state before it
		if st, found, err = r.status(ctx, node.Name); err != nil {
			return reconcile.Result{}, err
		}
	}
	if err := r.patch(ctx, &node, statusOf(w, found, st), false); err != nil {
		return reconcile.Result{}, err
	}
	set := mergeConditions(node.Status.Conditions, conditionsOf(w, found, st), time.Now())
	if err := r.patchConditions(ctx, &node, set, nil); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: requeueAfter(w, found, st, r.Resync)}, nil
}

// status reads the Cube node; found is false when it is not registered.
func (r *Reconciler) status(ctx context.Context, id string) (Status, bool, error) {
	st, err := r.Cube.Node(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return Status{}, false, nil
	case err != nil:
		return Status{}, false, fmt.Errorf("read cube node %s: %w", id, err)
	}
	return st, true, nil
}

func (r *Reconciler) do(ctx context.Context, id string, a action, d drainSpec) error {
	var err error
	switch a {
	case actIsolate:
		err = r.Cube.Isolate(ctx, id)
	case actUncordon:
		err = r.Cube.Uncordon(ctx, id)
	case actDrain:
		err = r.Cube.Drain(ctx, id, d.Policy, d.Grace)
	case actDelete, actForceDelete:
		err = r.Cube.Delete(ctx, id, a == actForceDelete)
		if errors.Is(err, errdefs.ErrNotFound) {
			err = nil // already gone: what we wanted
		}
	default:
		err = fmt.Errorf("unknown action %q: %w", a, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return fmt.Errorf("%s cube node %s: %w", a, id, err)
	}
	return nil
}

// patch sets the drain-status annotation ("" removes it) and, with
// release, removes the finalizer. It writes only when something changes.
func (r *Reconciler) patch(ctx context.Context, node *corev1.Node, status string, release bool) error {
	orig := node.DeepCopy()
	if release {
		controllerutil.RemoveFinalizer(node, Finalizer)
	}
	if status == "" {
		delete(node.Annotations, AnnotationDrainStatus)
	} else {
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		node.Annotations[AnnotationDrainStatus] = status
	}
	if maps.Equal(orig.Annotations, node.Annotations) && len(orig.Finalizers) == len(node.Finalizers) {
		return nil
	}
	// A Node that is gone has nothing left to update.
	err := client.IgnoreNotFound(r.Client.Patch(ctx, node, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})))
	if err != nil {
		return fmt.Errorf("update node %s: %w", node.Name, err)
	}
	return nil
}

// patchConditions writes the controller's conditions through the
// nodes/status subresource with a strategic merge patch that names only
// them: the kubelet's conditions are never touched, and no resourceVersion
// is sent, so the kubelet's frequent status updates cause no conflicts.
// Nothing to set or remove: no request.
func (r *Reconciler) patchConditions(ctx context.Context, node *corev1.Node, set []corev1.NodeCondition, remove []corev1.NodeConditionType) error {
	if len(set) == 0 && len(remove) == 0 {
		return nil
	}
	body, err := conditionsPatch(set, remove)
	if err != nil {
		return err
	}
	err = client.IgnoreNotFound(r.Client.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, body)))
	if err != nil {
		return fmt.Errorf("update conditions of node %s: %w", node.Name, err)
	}
	for _, c := range set {
		r.Log.Debug("node condition updated", "node", node.Name, "type", string(c.Type), "status", string(c.Status), "reason", c.Reason)
	}
	return nil
}

func (r *Reconciler) event(node *corev1.Node, typ, reason, act, note string) {
	if r.Events != nil {
		r.Events.Eventf(node, nil, typ, reason, act, "%s", note)
	}
}

// predicates lets through Nodes that are managed or still carry the
// finalizer, and only the changes the controller acts on (not the
// kubelet's status updates).
func (r *Reconciler) predicates() predicate.Predicate {
	interesting := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return r.Selector.Matches(labels.Set(o.GetLabels())) || controllerutil.ContainsFinalizer(o, Finalizer)
	})
	changed := predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		if !ok1 || !ok2 {
			return true
		}
		return o.Spec.Unschedulable != n.Spec.Unschedulable ||
			!maps.Equal(o.Labels, n.Labels) || !maps.Equal(o.Annotations, n.Annotations) ||
			len(o.Finalizers) != len(n.Finalizers) || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	}}
	return predicate.And(interesting, changed)
}
