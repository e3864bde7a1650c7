package hostnetgate

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	"k8s.io/client-go/rest"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Kube reads DaemonSets from a Kubernetes API server. It needs only `get`
// on daemonsets in the namespace.
type Kube struct {
	Client appsv1.DaemonSetsGetter
}

var _ DaemonSets = Kube{}

// NewKube builds a client from a REST config (rest.InClusterConfig in a Pod).
func NewKube(cfg *rest.Config) (Kube, error) {
	c, err := appsv1.NewForConfig(cfg)
	if err != nil {
		return Kube{}, fmt.Errorf("kubernetes client: %w", err)
	}
	return Kube{Client: c}, nil
}

// HostNetwork implements DaemonSets.
func (k Kube) HostNetwork(ctx context.Context, namespace, name string) (Live, error) {
	ds, err := k.Client.DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return Live{}, nil
	case apierrors.IsForbidden(err):
		return Live{}, fmt.Errorf("%v (the hook's Role must allow get on daemonsets): %w", err, errdefs.ErrPermissionDenied)
	case err != nil:
		return Live{}, fmt.Errorf("%v: %w", err, errdefs.ErrUnavailable)
	}
	return Live{Exists: true, HostNetwork: ds.Spec.Template.Spec.HostNetwork}, nil
}
