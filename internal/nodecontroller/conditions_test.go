package nodecontroller_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cube-dev/cube/internal/nodecontroller"
)

// TestNodeConditions: the controller keeps CubeDrain and CubeSchedulable on
// a managed Node through nodes/status, next to the kubelet's conditions:
// NotDraining, a bad annotation (InvalidAnnotation, Cube untouched), drain
// progress (True) to Done (False), no writes while nothing changes, and
// removal once the Node is no longer managed.
func TestNodeConditions(t *testing.T) {
	requireSuite(t)
	cube, k := startSuite(t)
	k.create(map[string]string{"cube.dev/compute": "true"}, nil)
	// What a kubelet reports; the controller must never clobber it.
	k.patchStatus(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status",
		"lastHeartbeatTime":"2030-01-01T00:00:00Z","lastTransitionTime":"2030-01-01T00:00:00Z"}]}}`)

	t.Log("step: managed and idle")
	n := k.waitCond("idle", func(d, s *corev1.NodeCondition) bool {
		return d.Status == corev1.ConditionFalse && d.Reason == nodecontroller.ReasonNotDraining &&
			s.Status == corev1.ConditionTrue && s.Reason == "Ready"
	})
	k.requireKubeletReady(n)

	t.Log("step: a bad annotation is reported and changes nothing")
	k.patch(`{"metadata":{"annotations":{"cube.dev/drain":"now"}}}`)
	n = k.waitCond("invalid annotation", func(d, _ *corev1.NodeCondition) bool {
		return d.Status == corev1.ConditionFalse && d.Reason == nodecontroller.ReasonInvalidAnnotation && strings.Contains(d.Message, `"now"`)
	})
	k.afterReconciles("", 1) // a second look changes nothing either
	if c := cube.node(); c == nil || c.State != "Ready" || c.Drain != nil {
		t.Fatalf("bad annotation changed the cube node: %+v", c)
	}
	k.requireKubeletReady(n)

	t.Log("step: a kubelet status update keeps the controller's conditions")
	k.patchStatus(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status",
		"lastHeartbeatTime":"2030-01-01T00:01:00Z","lastTransitionTime":"2030-01-01T00:00:00Z"}]}}`)
	if d, _ := conds(k.get()); d == nil || d.Reason != nodecontroller.ReasonInvalidAnnotation {
		t.Fatalf("kubelet update lost %s: %+v", nodecontroller.ConditionDrain, d)
	}

	t.Log("step: a drain is True with its progress, then Done and False")
	cube.createSandbox()
	k.patch(`{"metadata":{"annotations":{"cube.dev/drain":"kill","cube.dev/drain-grace":"3s"}}}`)
	n = k.waitCond("drain in progress", func(d, s *corev1.NodeCondition) bool {
		return d.Status == corev1.ConditionTrue && d.Reason != nodecontroller.ReasonInvalidAnnotation &&
			strings.Contains(d.Message, "policy kill") && strings.Contains(d.Message, "1 sandbox") &&
			s.Status == corev1.ConditionFalse && s.Reason == "Draining"
	})
	d, _ := conds(n)
	t.Logf("in progress: %s %s: %s", d.Status, d.Reason, d.Message)
	if d.Reason != "Grace" && d.Reason != "Killing" && d.Reason != nodecontroller.ReasonPending {
		t.Fatalf("drain reason %q, want a progress phase", d.Reason)
	}
	began := d.LastTransitionTime
	n = k.waitCond("drain done", func(d, _ *corev1.NodeCondition) bool {
		return d.Status == corev1.ConditionFalse && d.Reason == nodecontroller.ReasonDone && strings.Contains(d.Message, "0 sandboxes remaining")
	})
	if d, _ = conds(n); d.LastTransitionTime.Before(&began) {
		t.Fatalf("lastTransitionTime went back: %v after %v", d.LastTransitionTime, began)
	}
	k.requireKubeletReady(n)

	t.Log("step: no writes while nothing changes")
	rv := n.ResourceVersion
	k.afterReconciles("", 3) // idle resyncs
	if n = k.get(); n.ResourceVersion != rv {
		d, s := conds(n)
		t.Fatalf("node written while idle (resourceVersion %s -> %s): %+v %+v", rv, n.ResourceVersion, d, s)
	}

	t.Log("step: removing the annotation ends the drain")
	k.patch(`{"metadata":{"annotations":{"cube.dev/drain":null,"cube.dev/drain-grace":null}}}`)
	k.waitCond("uncordoned", func(d, s *corev1.NodeCondition) bool {
		return d.Status == corev1.ConditionFalse && d.Reason == nodecontroller.ReasonNotDraining && s.Status == corev1.ConditionTrue
	})

	t.Log("step: unmanaging removes the conditions")
	k.patch(`{"metadata":{"labels":{"cube.dev/compute":null}}}`)
	n = k.waitFor("conditions removed", func(n *corev1.Node) bool {
		d, s := conds(n)
		return d == nil && s == nil && len(n.Finalizers) == 0
	})
	k.requireKubeletReady(n)
}

// conds returns the controller's two conditions (nil: absent).
func conds(n *corev1.Node) (drain, sched *corev1.NodeCondition) {
	for i, c := range n.Status.Conditions {
		switch c.Type {
		case nodecontroller.ConditionDrain:
			drain = &n.Status.Conditions[i]
		case nodecontroller.ConditionSchedulable:
			sched = &n.Status.Conditions[i]
		}
	}
	return drain, sched
}

// waitCond waits until both conditions are there and cond holds.
func (k *kube) waitCond(what string, cond func(drain, sched *corev1.NodeCondition) bool) *corev1.Node {
	k.t.Helper()
	return k.waitFor(what, func(n *corev1.Node) bool {
		d, s := conds(n)
		return d != nil && s != nil && cond(d, s)
	})
}

// patchStatus patches nodes/status as a kubelet does (strategic merge).
func (k *kube) patchStatus(p string) {
	k.t.Helper()
	_, err := k.kc.CoreV1().Nodes().Patch(context.Background(), k.name, types.StrategicMergePatchType, []byte(p), metav1.PatchOptions{}, "status")
	if err != nil {
		k.t.Fatalf("patch node status %s: %v", p, err)
	}
}

// requireKubeletReady fails unless the kubelet's Ready condition survived.
func (k *kube) requireKubeletReady(n *corev1.Node) {
	k.t.Helper()
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && c.Reason == "KubeletReady" {
			return
		}
	}
	k.t.Fatalf("the kubelet's Ready condition is gone: %+v", n.Status.Conditions)
}
