package nodecontroller_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cube-dev/cube/internal/nodecontroller"
)

// TestNodeController runs the controller against a real kube-apiserver and
// etcd (envtest) and a real cube server with one cubelet named like the
// Kubernetes Node: cordon isolates, uncordon makes it Ready, the drain
// annotation drains with progress written back, and deleting the Node
// drains the Cube node, deregisters it and releases the finalizer.
func TestNodeController(t *testing.T) {
	requireSuite(t)
	cube, k := startSuite(t)
	kc := k.kc
	k.create(map[string]string{"cube.dev/compute": "true"}, nil)
	k.waitFor("finalizer", func(n *corev1.Node) bool { return slices.Contains(n.Finalizers, nodecontroller.Finalizer) })
	k.waitFor("lease", func(*corev1.Node) bool {
		_, err := kc.CoordinationV1().Leases("default").Get(context.Background(), nodecontroller.Name, metav1.GetOptions{})
		return err == nil
	})

	t.Log("step: cordon isolates")
	k.patch(`{"spec":{"unschedulable":true}}`)
	cube.waitState("Isolated", 20*time.Second)
	t.Log("step: uncordon makes it Ready")
	k.patch(`{"spec":{"unschedulable":null}}`)
	cube.waitState("Ready", 20*time.Second)
	t.Log("step: drain annotation drains and reports")
	cube.createSandbox()
	k.patch(`{"metadata":{"annotations":{"cube.dev/drain":"kill","cube.dev/drain-grace":"2s"}}}`)
	cube.waitState("Draining", 20*time.Second)
	st := k.waitStatus("drain status", func(s drainStatus) bool { return s.Policy == "kill" && s.Phase != "" })
	t.Logf("first status: %+v", st)
	k.waitStatus("drain done", func(s drainStatus) bool { return s.Phase == "done" && s.Remaining == 0 })
	if n := cube.node(); n == nil || n.Sandboxes != 0 {
		t.Fatalf("cube node after drain: %+v", n)
	}
	t.Log("step: removing the annotation uncordons")
	k.patch(`{"metadata":{"annotations":{"cube.dev/drain":null,"cube.dev/drain-grace":null}}}`)
	cube.waitState("Ready", 20*time.Second)
	k.waitFor("drain status removed", func(n *corev1.Node) bool {
		_, ok := n.Annotations[nodecontroller.AnnotationDrainStatus]
		return !ok
	})
	t.Log("step: delete drains then deregisters")
	sb := cube.createSandbox()
	k.patch(`{"metadata":{"annotations":{"cube.dev/drain-grace":"1s"}}}`)
	k.delete()
	cube.waitFor("deregistration", 60*time.Second, func() bool { return cube.deleted(false) })
	k.waitGone()
	// The sandbox was killed by the drain before the node was deleted, not forgotten.
	log := cube.server.Read()
	killed := strings.Index(log, `msg="sandbox killed" role=cubemaster component=cubemaster sandbox=`+sb)
	if killed < 0 || killed > strings.Index(log, `msg="node deleted"`) || cube.deleted(true) {
		t.Fatalf("want sandbox %s killed by the drain, then the node deleted without force; server log:\n%s", sb, cube.server.Tail())
	}
	t.Log("step: force delete")
	// The cubelet still runs, so it registers again (as a kubelet
	// would recreate its Node); delete both once more, forcibly.
	cube.waitState("Ready", 30*time.Second)
	k.create(map[string]string{"cube.dev/compute": "true"}, map[string]string{nodecontroller.AnnotationForceDelete: "true"})
	k.waitFor("finalizer", func(n *corev1.Node) bool { return slices.Contains(n.Finalizers, nodecontroller.Finalizer) })
	cube.createSandbox()
	k.delete()
	cube.waitFor("forced deregistration", 30*time.Second, func() bool { return cube.deleted(true) })
	k.waitGone()
	t.Log("step: unlabelled nodes are left alone")
	cube.waitState("Ready", 30*time.Second)
	k.create(nil, nil)
	k.patch(`{"spec":{"unschedulable":true}}`)
	// The controller takes Node events in order: once a managed Node
	// created after the patch has been reconciled, the patch was seen too.
	probe := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.name + "-probe", Labels: map[string]string{"cube.dev/compute": "true"}}}
	if _, err := k.kc.CoreV1().Nodes().Create(context.Background(), probe, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create probe node: %v", err)
	}
	k.afterReconciles(probe.Name, 1)
	if n := cube.node(); n == nil || n.State != "Ready" {
		t.Fatalf("unmanaged node changed cube: %+v", n)
	}
	if n := k.get(); n == nil || len(n.Finalizers) != 0 {
		t.Fatalf("unmanaged node got finalizers: %+v", n)
	}
}

// startSuite starts a cube server with one cubelet, a kube-apiserver and
// the controller (leader-elected, 1 s resync); the kube drives the Node
// named like the cubelet.
func startSuite(t *testing.T) (*cubeEnv, *kube) {
	t.Helper()
	name := "kn-" + randHex(3)
	cube := newCubeEnv(t, name)

	env := &envtest.Environment{BinaryAssetsDirectory: os.Getenv("KUBEBUILDER_ASSETS")}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest (KUBEBUILDER_ASSETS=%s): %v", os.Getenv("KUBEBUILDER_ASSETS"), err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop envtest: %v", err)
		}
	})
	kc := kubernetes.NewForConfigOrDie(cfg)

	client, err := nodecontroller.NewHTTPCube(cube.url, cube.key, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	counts := &reconcileCounter{n: map[string]int{}}
	go func() {
		done <- nodecontroller.Run(ctx, cfg, nodecontroller.Options{
			Cube: client, LeaderElection: true, LeaderElectionNamespace: "default",
			Resync: time.Second, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
			Reconciled: counts.inc,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	return cube, &kube{t: t, kc: kc, name: name, reconciles: counts}
}

// reconcileCounter counts the controller's reconciles per Node, so a test
// that must show the controller left something alone waits for it to have
// looked instead of sleeping.
type reconcileCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *reconcileCounter) inc(node string) {
	c.mu.Lock()
	c.n[node]++
	c.mu.Unlock()
}

func (c *reconcileCounter) get(node string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[node]
}

type drainStatus struct {
	Policy    string `json:"policy"`
	Phase     string `json:"phase"`
	Remaining int    `json:"remaining"`
	Message   string `json:"message"`
}

// kube drives one Node through client-go.
type kube struct {
	t          *testing.T
	kc         *kubernetes.Clientset
	name       string
	reconciles *reconcileCounter
}

// afterReconciles returns once the controller has reconciled node (default
// k's Node) n more times from now: whatever it would do about the state
// the test set up, it has done.
func (k *kube) afterReconciles(node string, n int) {
	k.t.Helper()
	if node == "" {
		node = k.name
	}
	want := k.reconciles.get(node) + n
	deadline := time.Now().Add(30 * time.Second)
	for k.reconciles.get(node) < want {
		if time.Now().After(deadline) {
			k.t.Fatalf("timed out waiting for %d reconciles of node %s", n, node)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (k *kube) create(labels, annotations map[string]string) {
	k.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.name, Labels: labels, Annotations: annotations}}
	if _, err := k.kc.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		k.t.Fatalf("create node: %v", err)
	}
}

func (k *kube) get() *corev1.Node {
	n, err := k.kc.CoreV1().Nodes().Get(context.Background(), k.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		k.t.Fatalf("get node: %v", err)
	}
	return n
}

func (k *kube) patch(p string) {
	k.t.Helper()
	if _, err := k.kc.CoreV1().Nodes().Patch(context.Background(), k.name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
		k.t.Fatalf("patch node %s: %v", p, err)
	}
}

func (k *kube) delete() {
	k.t.Helper()
	if err := k.kc.CoreV1().Nodes().Delete(context.Background(), k.name, metav1.DeleteOptions{}); err != nil {
		k.t.Fatalf("delete node: %v", err)
	}
}

func (k *kube) waitFor(what string, cond func(*corev1.Node) bool) *corev1.Node {
	k.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := k.get()
		if n != nil && cond(n) {
			return n
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("timed out waiting for %s on node %s: %+v", what, k.name, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (k *kube) waitStatus(what string, cond func(drainStatus) bool) drainStatus {
	k.t.Helper()
	var st drainStatus
	k.waitFor(what, func(n *corev1.Node) bool {
		v, ok := n.Annotations[nodecontroller.AnnotationDrainStatus]
		st = drainStatus{}
		return ok && json.Unmarshal([]byte(v), &st) == nil && cond(st)
	})
	return st
}

func (k *kube) waitGone() {
	k.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for k.get() != nil {
		if time.Now().After(deadline) {
			k.t.Fatalf("node %s still exists (finalizers %v)", k.name, k.get().Finalizers)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testWriter sends the controller's log to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
