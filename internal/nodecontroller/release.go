package nodecontroller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ReleasedNode is what Release did to one Node matching the selector.
type ReleasedNode struct {
	Name string
	// Finalizer and DrainStatus are true when the finalizer and the
	// cube.dev/drain-status annotation were removed.
	Finalizer   bool
	DrainStatus bool
	// Conditions are the controller's condition types that were removed.
	Conditions []corev1.NodeConditionType
	// Deleting: the Node was being deleted and waited for the finalizer;
	// releasing it lets the deletion finish.
	Deleting bool
}

// Changed reports whether anything was removed from the Node.
func (n ReleasedNode) Changed() bool {
	return n.Finalizer || n.DrainStatus || len(n.Conditions) > 0
}

// String is one report line: "node N: removed finalizer ..., ...".
func (n ReleasedNode) String() string {
	if !n.Changed() {
		return fmt.Sprintf("node %s: nothing to release", n.Name)
	}
	var what []string
	if n.Finalizer {
		what = append(what, "finalizer "+Finalizer)
	}
	if n.DrainStatus {
		what = append(what, "annotation "+AnnotationDrainStatus)
	}
	if len(n.Conditions) > 0 {
		cs := make([]string, len(n.Conditions))
		for i, c := range n.Conditions {
			cs[i] = string(c)
		}
		what = append(what, "conditions "+strings.Join(cs, ","))
	}
	s := fmt.Sprintf("node %s: removed %s", n.Name, strings.Join(what, ", "))
	if n.Deleting && n.Finalizer {
		s += " (the Node was being deleted: its deletion now completes)"
	}
	return s
}

// Release removes what the node controller put on every Node matching sel:
// the finalizer Finalizer, the annotation AnnotationDrainStatus and the
// conditions ConditionDrain and ConditionSchedulable (through nodes/status;
// the kubelet's conditions are kept). It never calls Cube's server, which
// may already be gone, and is idempotent: a Node with nothing of Cube's is
// not written. Nodes outside sel are not touched, even if they carry the
// finalizer (another release's controller may manage them).
//
// The controller must not run while Release does, or it adds its finalizer
// back (see StopDeployment). A failure on one Node does not stop the
// others; the errors are joined. The result lists every matching Node.
func Release(ctx context.Context, c client.Client, sel labels.Selector, log *slog.Logger) ([]ReleasedNode, error) {
	if sel == nil || sel.Empty() {
		return nil, fmt.Errorf("release nodes: an empty selector selects every Node: name the compute pool's label: %w", errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.Default()
	}
	var list corev1.NodeList
	if err := c.List(ctx, &list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list nodes matching %q: %w", sel.String(), err)
	}
	out := make([]ReleasedNode, 0, len(list.Items))
	var errs []error
	for i := range list.Items {
		r, err := releaseNode(ctx, c, &list.Items[i])
		out = append(out, r)
		if err != nil {
			errs = append(errs, err)
			log.Error("release node", "node", r.Name, "err", err)
			continue
		}
		if r.Changed() {
			log.Info("node released", "node", r.Name, "finalizer", r.Finalizer, "drainStatus", r.DrainStatus,
				"conditions", fmt.Sprint(r.Conditions), "deleting", r.Deleting)
		} else {
			log.Debug("node has nothing to release", "node", r.Name)
		}
	}
	return out, errors.Join(errs...)
}

// releaseNode removes Cube's conditions first (while the finalizer is
// there, a failed run is simply repeated), then the annotation and the
// finalizer in one merge patch with optimistic locking, retried on
// conflicts: finalizers are a plain list, and a stale patch would drop a
// finalizer someone else added meanwhile.
func releaseNode(ctx context.Context, c client.Client, node *corev1.Node) (ReleasedNode, error) {
	r := ReleasedNode{Name: node.Name, Deleting: node.DeletionTimestamp != nil}
	if stale := staleConditions(node.Status.Conditions); len(stale) > 0 {
		body, err := conditionsPatch(nil, stale)
		if err != nil {
			return r, err
		}
		err = c.Status().Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, body))
		switch {
		case apierrors.IsNotFound(err):
			return r, nil // gone: nothing left to release
		case err != nil:
			return r, fmt.Errorf("remove conditions of node %s: %w", node.Name, err)
		}
		r.Conditions = stale
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur corev1.Node
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), &cur); err != nil {
			return err
		}
		orig := cur.DeepCopy()
		_, annotated := cur.Annotations[AnnotationDrainStatus]
		finalized := controllerutil.RemoveFinalizer(&cur, Finalizer)
		delete(cur.Annotations, AnnotationDrainStatus)
		r.Deleting = cur.DeletionTimestamp != nil
		if !annotated && !finalized {
			return nil
		}
		if err := c.Patch(ctx, &cur, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
			return err
		}
		r.DrainStatus, r.Finalizer = annotated, finalized
		return nil
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return r, fmt.Errorf("remove finalizer and annotation of node %s: %w", node.Name, err)
	}
	return r, nil
}

// StopDeployment deletes the Deployment key with foreground propagation
// and waits until it is gone. Foreground deletion keeps the Deployment
// until the garbage collector has deleted its ReplicaSets, and those until
// their Pods are gone, so when the Deployment disappears no controller
// Pod runs any more. A Deployment that does not exist is not an error.
// It waits at most timeout (0: until ctx ends).
func StopDeployment(ctx context.Context, c client.Client, key types.NamespacedName, timeout time.Duration, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var d appsv1.Deployment
	err := c.Get(ctx, key, &d)
	if apierrors.IsNotFound(err) {
		log.Info("deployment not found: nothing to stop", "deployment", key.String())
		return nil
	}
	if err != nil {
		return fmt.Errorf("get deployment %s: %w", key, err)
	}
	if d.DeletionTimestamp == nil || !slices.Contains(d.Finalizers, metav1.FinalizerDeleteDependents) {
		err = c.Delete(ctx, &d, client.PropagationPolicy(metav1.DeletePropagationForeground))
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("delete deployment %s: %w", key, err)
		}
		log.Info("deployment deleted (foreground); waiting for its Pods to end", "deployment", key.String())
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		err := c.Get(ctx, key, &d)
		if apierrors.IsNotFound(err) {
			log.Info("deployment gone", "deployment", key.String())
			return nil
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("read deployment", "deployment", key.String(), "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("deployment %s still exists (its Pods may not have ended): %w: %w", key, ctx.Err(), errdefs.ErrUnavailable)
		case <-tick.C:
		}
	}
}
