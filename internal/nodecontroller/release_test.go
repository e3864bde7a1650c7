package nodecontroller_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cube-dev/cube/internal/nodecontroller"
)

// apiServer starts a kube-apiserver and etcd (envtest) for one test; no
// root and no cube binaries needed. Without assets it skips, or fails
// under CI=true.
func apiServer(t *testing.T) client.Client {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	why := ""
	if assets == "" {
		why = "KUBEBUILDER_ASSETS is not set: run KUBEBUILDER_ASSETS=\"$(bash hack/kube-test-assets.sh)\" go test ./internal/nodecontroller/"
	} else if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		why = "KUBEBUILDER_ASSETS=" + assets + " has no kube-apiserver: run bash hack/kube-test-assets.sh"
	}
	if why != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest (KUBEBUILDER_ASSETS=%s): %v", assets, err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop envtest: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReleaseNodes: Release removes Cube's finalizer, drain-status
// annotation and conditions from every selected Node, keeps everything
// else (other finalizers and annotations, the kubelet's conditions), lets
// a pending deletion finish, leaves unselected Nodes alone, and changes
// nothing on a second run.
func TestReleaseNodes(t *testing.T) {
	c := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	compute := map[string]string{"cube.dev/compute": "true"}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(typ corev1.NodeConditionType, s corev1.ConditionStatus) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: s, Reason: "Test", Message: "set by the test", LastHeartbeatTime: now, LastTransitionTime: now}
	}
	cubeMarks := func(extraFinalizers ...string) ([]string, map[string]string, []corev1.NodeCondition) {
		return append([]string{nodecontroller.Finalizer}, extraFinalizers...),
			map[string]string{nodecontroller.AnnotationDrainStatus: `{"policy":"kill","phase":"done","remaining":0}`, "example.com/keep": "yes"},
			[]corev1.NodeCondition{cond(corev1.NodeReady, corev1.ConditionTrue), cond(corev1.NodeMemoryPressure, corev1.ConditionFalse),
				cond(nodecontroller.ConditionDrain, corev1.ConditionFalse), cond(nodecontroller.ConditionSchedulable, corev1.ConditionTrue)}
	}
	mk := func(name string, lbl map[string]string, fin []string, ann map[string]string, conds []corev1.NodeCondition) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl, Finalizers: fin, Annotations: ann}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		if len(conds) > 0 {
			n.Status.Conditions = conds
			if err := c.Status().Update(ctx, n); err != nil {
				t.Fatalf("set conditions of node %s: %v", name, err)
			}
		}
	}
	fin, ann, conds := cubeMarks("example.com/keep")
	mk("managed", compute, fin, ann, conds)
	mk("clean", compute, nil, nil, []corev1.NodeCondition{cond(corev1.NodeReady, corev1.ConditionTrue)})
	fin, ann, conds = cubeMarks()
	mk("unlabelled", nil, fin, ann, conds)
	mk("other-pool", map[string]string{"cube.dev/compute": "false"}, fin, ann, conds)
	fin, ann, conds = cubeMarks()
	mk("deleting", compute, fin, ann, conds)
	if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "deleting"}}); err != nil {
		t.Fatal(err)
	}
	getNode := func(name string) *corev1.Node {
		t.Helper()
		var n corev1.Node
		err := c.Get(ctx, types.NamespacedName{Name: name}, &n)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return &n
	}
	if n := getNode("deleting"); n == nil || n.DeletionTimestamp == nil {
		t.Fatalf("node deleting: want it held by the finalizer, got %+v", n)
	}
	before := map[string]string{}
	for _, name := range []string{"unlabelled", "other-pool", "clean"} {
		before[name] = getNode(name).ResourceVersion
	}

	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	sel := labels.SelectorFromSet(compute)
	got, err := nodecontroller.Release(ctx, c, sel, log)
	if err != nil {
		t.Fatalf("release: %v\n%s", err, logs.String())
	}
	t.Logf("release log:\n%s", logs.String())
	byName := map[string]nodecontroller.ReleasedNode{}
	for _, r := range got {
		byName[r.Name] = r
		t.Log(r.String())
	}
	if len(got) != 3 {
		t.Fatalf("release reported %d nodes, want managed, clean, deleting: %+v", len(got), got)
	}
	all := []corev1.NodeConditionType{nodecontroller.ConditionDrain, nodecontroller.ConditionSchedulable}
	if r := byName["managed"]; !r.Finalizer || !r.DrainStatus || !slices.Equal(r.Conditions, all) || r.Deleting {
		t.Errorf("managed: %+v", r)
	}
	if r := byName["clean"]; r.Changed() || r.String() != "node clean: nothing to release" {
		t.Errorf("clean: %+v (%s)", r, r)
	}
	if r := byName["deleting"]; !r.Finalizer || !r.Deleting || !strings.Contains(r.String(), "deletion now completes") {
		t.Errorf("deleting: %+v (%s)", r, r)
	}

	n := getNode("managed")
	if !slices.Equal(n.Finalizers, []string{"example.com/keep"}) {
		t.Errorf("managed finalizers = %v, want only example.com/keep", n.Finalizers)
	}
	if _, ok := n.Annotations[nodecontroller.AnnotationDrainStatus]; ok || n.Annotations["example.com/keep"] != "yes" {
		t.Errorf("managed annotations = %v", n.Annotations)
	}
	var kinds []corev1.NodeConditionType
	for _, c := range n.Status.Conditions {
		kinds = append(kinds, c.Type)
	}
	if !slices.Equal(kinds, []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeMemoryPressure}) {
		t.Errorf("managed conditions = %v, want the kubelet's Ready and MemoryPressure only", kinds)
	}
	if n := getNode("deleting"); n != nil {
		t.Errorf("node deleting still exists: finalizers %v", n.Finalizers)
	}
	for _, name := range []string{"unlabelled", "other-pool", "clean"} {
		n := getNode(name)
		if n.ResourceVersion != before[name] {
			t.Errorf("node %s was written (resourceVersion %s -> %s)", name, before[name], n.ResourceVersion)
		}
		if name != "clean" && (!slices.Contains(n.Finalizers, nodecontroller.Finalizer) || len(n.Status.Conditions) != 4) {
			t.Errorf("unselected node %s lost Cube's marks: %+v", name, n)
		}
	}

	t.Log("step: a second run changes nothing")
	rv := getNode("managed").ResourceVersion
	got, err = nodecontroller.Release(ctx, c, sel, log)
	if err != nil || len(got) != 2 {
		t.Fatalf("second release = %+v, %v", got, err)
	}
	for _, r := range got {
		if r.Changed() {
			t.Errorf("second release changed %s: %+v", r.Name, r)
		}
	}
	if n := getNode("managed"); n.ResourceVersion != rv {
		t.Errorf("second release wrote node managed (resourceVersion %s -> %s)", rv, n.ResourceVersion)
	}

	if _, err := nodecontroller.Release(ctx, c, labels.Everything(), log); err == nil {
		t.Error("release with an empty selector: want an error")
	}
}

// TestStopDeployment: the controller's Deployment is deleted with
// foreground propagation and StopDeployment returns only once it is gone
// (envtest has no garbage collector: the test plays it by removing the
// foregroundDeletion finalizer); a missing Deployment is fine; one that
// stays is an error after the timeout.
func TestStopDeployment(t *testing.T) {
	c := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	key := types.NamespacedName{Namespace: "default", Name: nodecontroller.Name}

	if err := nodecontroller.StopDeployment(ctx, c, key, 5*time.Second, log); err != nil {
		t.Fatalf("no deployment: %v", err)
	}

	lbl := map[string]string{"app": "nc"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: lbl},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbl},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "cube:test"}}},
			},
		},
	}
	if err := c.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	// Without a garbage collector the Deployment stays: a timeout.
	if err := nodecontroller.StopDeployment(ctx, c, key, 2*time.Second, log); err == nil || !strings.Contains(err.Error(), "still exists") {
		t.Fatalf("deployment that stays: %v, want a timeout", err)
	}
	var cur appsv1.Deployment
	if err := c.Get(ctx, key, &cur); err != nil {
		t.Fatal(err)
	}
	if cur.DeletionTimestamp == nil || !slices.Contains(cur.Finalizers, metav1.FinalizerDeleteDependents) {
		t.Fatalf("deployment not deleted in the foreground: deletionTimestamp %v, finalizers %v", cur.DeletionTimestamp, cur.Finalizers)
	}

	// A second run waits again; the "garbage collector" finishes meanwhile.
	done := make(chan error, 1)
	go func() { done <- nodecontroller.StopDeployment(ctx, c, key, 30*time.Second, log) }()
	select {
	case err := <-done:
		t.Fatalf("StopDeployment returned while the deployment exists: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	if err := c.Patch(ctx, &cur, patch); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("StopDeployment after the deployment went: %v", err)
	}
}
