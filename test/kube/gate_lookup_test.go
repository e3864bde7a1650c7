package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cube-dev/cube/internal/hostnetgate"
)

// TestHostNetworkGateAtRenderTime renders the chart the way helm
// install/upgrade does, with lookup reading a real kube-apiserver: a flip
// of cubeNode.hostNetwork against the live cube-node DaemonSet without the
// ack fails the render with exactly the hook's sentence (both ways out), so
// helm prints it; the ack, an unchanged value or no DaemonSet render; and
// without a cluster (helm template) the render passes and the hook still
// carries the check.
func TestHostNetworkGateAtRenderTime(t *testing.T) {
	const ns = "cube-gate-lookup"
	cfg, kc := apiServerNamespace(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const podNetwork = "cubeNode: {hostNetwork: false}"
	const podNetworkAck = "cubeNode: {hostNetwork: false, hostNetworkChangeAck: true}"

	// First install: nothing live, either mode renders.
	for _, v := range []string{"", podNetwork} {
		if _, err := RenderLive(cfg, chartDir, ns, false, v); err != nil {
			t.Errorf("install with %q and no live DaemonSet: %v", v, err)
		}
	}

	// The release's own DaemonSet, as the first install created it.
	objs := render(t, "")
	ds := &appsv1.DaemonSet{}
	fromDoc(t, get(t, objs, "DaemonSet", "cube-node").Doc, ds)
	ds.Namespace = ns
	if _, err := kc.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		kc.AppsV1().DaemonSets(ns).Delete(context.WithoutCancel(ctx), "cube-node", metav1.DeleteOptions{})
	})

	refused := func(values string, live, desired bool) {
		t.Helper()
		_, err := RenderLive(cfg, chartDir, ns, true, values)
		want := hostnetgate.Decide("cube-node", hostnetgate.Live{Exists: true, HostNetwork: live}, desired, false)
		if want.Allow {
			t.Fatalf("test bug: the hook would allow %q", values)
		}
		if err == nil || !strings.Contains(err.Error(), want.Message) {
			t.Errorf("upgrade with %q over live hostNetwork=%t: render error %v\nwant the hook's refusal %q", values, live, err, want.Message)
		}
	}
	allowed := func(values string) {
		t.Helper()
		if _, err := RenderLive(cfg, chartDir, ns, true, values); err != nil {
			t.Errorf("upgrade with %q: %v", values, err)
		}
	}
	refused(podNetwork, true, false)
	allowed(podNetworkAck)
	allowed("")
	allowed("cubeNode: {logLevel: debug}")

	// helm template / client-side dry run: lookup is empty, the render
	// passes and the hook Job carries the same check to the cluster.
	objs, err := Render(chartDir, podNetwork)
	if err != nil {
		t.Fatalf("helm template of the flip: %v", err)
	}
	if job := string(get(t, objs, "Job", "cube-node-hostnet-preflight").Raw); !strings.Contains(job, "--desired=false") || !strings.Contains(job, "--ack=false") {
		t.Errorf("hook Job does not carry the flip:\n%s", job)
	}

	// Live on the Pod network: going back without the ack is refused too.
	live, err := kc.AppsV1().DaemonSets(ns).Get(ctx, "cube-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	live.Spec.Template.Spec.HostNetwork = false
	if _, err := kc.AppsV1().DaemonSets(ns).Update(ctx, live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused("", false, true)
	allowed(podNetwork)
	allowed("cubeNode: {hostNetwork: true, hostNetworkChangeAck: true}")
}
