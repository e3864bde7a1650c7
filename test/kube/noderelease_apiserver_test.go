package kube

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cube-dev/cube/internal/nodecontroller"
)

// TestNodeReleaseHookRBACAgainstAPIServer creates the release hook's
// rendered ServiceAccount and RBAC in a real kube-apiserver and runs what
// the hook Job runs as that ServiceAccount: it may delete the controller's
// Deployment (and no other), and release a managed Node.
func TestNodeReleaseHookRBACAgainstAPIServer(t *testing.T) {
	cfg := realAPIServer(t)
	admin, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	cleanup := func(o client.Object) {
		t.Cleanup(func() { // the API server is shared by the package run (and -count=N)
			ctx := context.Background()
			// A failed run leaves finalizers (Cube's, foregroundDeletion).
			admin.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
			admin.Delete(ctx, o)
		})
	}
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "cube-system"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, o := range render(t, "") {
		if o.Template != "cube/templates/hook-node-release.yaml" || o.Kind() == "Job" {
			continue
		}
		u := &unstructured.Unstructured{Object: o.Doc}
		if err := admin.Create(ctx, u.DeepCopy()); err != nil {
			t.Fatalf("create %s %s: %v", o.Kind(), o.Name(), err)
		}
		cleanup(u)
	}
	deployment := func(name string) *appsv1.Deployment {
		lbl := map[string]string{"app": name}
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "cube-system"},
			Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: lbl},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: lbl},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "cube:test"}}},
				},
			},
		}
		if err := admin.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
		cleanup(d)
		return d
	}
	deployment("cube-node-controller")
	server := deployment("cube-server")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("release-rbac-%d", time.Now().UnixNano()), Labels: map[string]string{"cube.dev/compute": "true"},
		Finalizers: []string{nodecontroller.Finalizer}, Annotations: map[string]string{nodecontroller.AnnotationDrainStatus: "{}"},
	}}
	if err := admin.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	cleanup(node)
	node.Status.Conditions = []corev1.NodeCondition{{Type: nodecontroller.ConditionDrain, Status: corev1.ConditionFalse, Reason: "NotDraining"}}
	if err := admin.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}

	hookCfg := rest.CopyConfig(cfg)
	hookCfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:cube-system:cube-node-release",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:cube-system", "system:authenticated"},
	}
	hook, err := client.New(hookCfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testLog{t}, nil))
	if err := hook.Delete(ctx, server); !apierrors.IsForbidden(err) {
		t.Errorf("hook deletes Deployment cube-server: %v, want Forbidden", err)
	}
	if err := hook.List(ctx, &corev1.PodList{}, client.InNamespace("cube-system")); !apierrors.IsForbidden(err) {
		t.Errorf("hook lists Pods: %v, want Forbidden", err)
	}
	// envtest runs no garbage collector: the foreground deletion cannot
	// finish, so StopDeployment times out after deleting; the test then
	// plays the collector and a second run sees the Deployment gone.
	key := types.NamespacedName{Namespace: "cube-system", Name: "cube-node-controller"}
	if err := nodecontroller.StopDeployment(ctx, hook, key, 2*time.Second, log); err == nil || !strings.Contains(err.Error(), "still exists") {
		t.Fatalf("stop as the hook: %v, want a timeout after the deletion", err)
	}
	var d appsv1.Deployment
	if err := admin.Get(ctx, key, &d); err != nil || d.DeletionTimestamp == nil {
		t.Fatalf("controller Deployment after the hook's delete: %v, deletionTimestamp %v", err, d.DeletionTimestamp)
	}
	d.Finalizers = nil
	if err := admin.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	if err := nodecontroller.StopDeployment(ctx, hook, key, 10*time.Second, log); err != nil {
		t.Fatalf("stop as the hook, Deployment gone: %v", err)
	}

	got, err := nodecontroller.Release(ctx, hook, labels.SelectorFromSet(labels.Set{"cube.dev/compute": "true"}), log)
	if err != nil {
		t.Fatalf("release as the hook: %v", err)
	}
	var n corev1.Node
	if err := admin.Get(ctx, client.ObjectKeyFromObject(node), &n); err != nil {
		t.Fatal(err)
	}
	if len(n.Finalizers) != 0 || len(n.Annotations) != 0 || len(n.Status.Conditions) != 0 {
		t.Errorf("node after release as the hook (%v): finalizers %v, annotations %v, conditions %v", got, n.Finalizers, n.Annotations, n.Status.Conditions)
	}
}

// testLog sends a slog text handler's lines to t.Log.
type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
