package kubereal

import (
	"context"
	"strings"
	"testing"
	"time"
)

// testHostNetworkFlip: flipping cubeNode.hostNetwork moves cubelet's
// address and recreates the Big Pod, so the chart refuses it without
// cubeNode.hostNetworkChangeAck and helm's own output must say why. With
// the ack the Pod moves to the Pod network and back; sandboxes keep running
// and stay reachable through the proxy; creates work on both networks.
func testHostNetworkFlip(t *testing.T) {
	f := counterFleet(t)
	t.Cleanup(func() { restoreRelease(t) })
	if live, err := liveHostNetwork(testCtx(t)); err != nil || !live {
		t.Fatalf("this test starts from cubeNode.hostNetwork=true (the values file's); live DaemonSet: %v, %v", live, err)
	}

	before := readyNodePod(t, 3*time.Minute)
	gen0 := dsGeneration(t)
	t.Logf("$ helm upgrade ... --set cubeNode.hostNetwork=false (no ack: must be refused)")
	out, err := helmUpgrade(testCtx(t), "cubeNode.hostNetwork=false")
	if err == nil {
		t.Fatalf("helm upgrade --set cubeNode.hostNetwork=false without the ack was accepted:\n%s", tail(out, 20))
	}
	t.Logf("refused as it should be; helm said:\n%s", tail(out, 20))
	// The operator reads helm's output, not the hook Job's log: it must name
	// the change and the ack that allows it.
	for _, want := range []string{"hostNetwork", "hostNetworkChangeAck=true"} {
		if !strings.Contains(out, want) {
			t.Errorf("helm's output for the refused flip does not say why (no %q); it was:\n%s", want, tail(out, 20))
		}
	}
	if live, _ := liveHostNetwork(testCtx(t)); !live {
		t.Fatalf("the refused upgrade changed the DaemonSet to hostNetwork=false")
	}
	assertPodKept(t, before, gen0, "the refused upgrade")

	pod := recreate(t, "hostNetwork true -> false (with the ack)", f, func(ctx context.Context) error {
		_, err := helmUpgrade(ctx, "cubeNode.hostNetwork=false", "cubeNode.hostNetworkChangeAck=true")
		return err
	})
	if pod.Spec.HostNetwork || pod.Status.PodIP == "" || pod.Status.PodIP == pod.Status.HostIP {
		t.Errorf("the new cube-node Pod is not on the Pod network: hostNetwork=%v podIP=%s hostIP=%s", pod.Spec.HostNetwork, pod.Status.PodIP, pod.Status.HostIP)
	}
	n := waitCubeNodeState(t, "Ready", 2*time.Minute)
	if !strings.Contains(n.Address, pod.Status.PodIP) {
		t.Errorf("cube node %s advertises %s, not the Pod IP %s", n.ID, n.Address, pod.Status.PodIP)
	}
	f.verify(t, "the flip to the Pod network")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)
	mustCreateOne(t, "on the Pod network")

	// The ack back to false is policy-only: the same Pod keeps running.
	gen := dsGeneration(t)
	mustHelmUpgrade(t, "cubeNode.hostNetwork=false")
	assertPodKept(t, pod, gen, "setting the ack back to false")

	pod = recreate(t, "hostNetwork false -> true (with the ack)", f, func(ctx context.Context) error {
		_, err := helmUpgrade(ctx, "cubeNode.hostNetworkChangeAck=true")
		return err
	})
	if !pod.Spec.HostNetwork {
		t.Errorf("the cube-node Pod is not back on the host network")
	}
	f.verify(t, "the flip back to the host network")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)
	gen = dsGeneration(t)
	mustHelmUpgrade(t)
	assertPodKept(t, pod, gen, "setting the ack back to false")
}
