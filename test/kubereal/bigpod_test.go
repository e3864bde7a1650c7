package kubereal

import (
	"context"
	"slices"
	"testing"
)

func deleteNodePod(extra ...string) func(context.Context) error {
	return func(ctx context.Context) error {
		args := append([]string{"delete", "pod", "-l", "app.kubernetes.io/component=node", "--wait=false"}, extra...)
		_, err := kubectl(ctx, args...)
		return err
	}
}

// testBigPodDelete: the seed's failure was every sandbox dying with the Big
// Pod. Delete the cube-node Pod (gracefully: preStop, SIGTERM; then
// forcefully: no grace at all) with 10 sandboxes counting: each keeps
// running and answers under its id, no mapping is orphaned, a create right
// after the new Pod is Ready works.
func testBigPodDelete(t *testing.T) {
	f := counterFleet(t)
	if live, err := liveHostNetwork(testCtx(t)); err != nil || !live {
		t.Fatalf("this test runs with cubeNode.hostNetwork=true (the values file's); live DaemonSet: %v, %v", live, err)
	}
	pod := recreate(t, "kubectl delete pod", f, deleteNodePod())
	f.verify(t, "kubectl delete pod")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)

	pod = recreate(t, "kubectl delete pod --force --grace-period=0", f, deleteNodePod("--force", "--grace-period=0"))
	f.verify(t, "a forced delete of the Pod")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)
}

// testRedLineUpgrade: a helm upgrade that changes a red-line value
// (cubeNode.logLevel, docs/kubernetes/upgrade.md) recreates the Big Pod
// through the DaemonSet rollout; sandboxes survive it and the way back.
func testRedLineUpgrade(t *testing.T) {
	f := counterFleet(t)
	t.Cleanup(func() { restoreRelease(t) })
	level := "debug"
	if valueString(releaseValues(t), "cubeNode.logLevel") == level {
		level = "warn"
	}
	pod := recreate(t, "helm upgrade cubeNode.logLevel="+level, f, func(ctx context.Context) error {
		_, err := helmUpgrade(ctx, "cubeNode.logLevel="+level)
		return err
	})
	if args := cubeletContainer(t, pod).Args; !slices.Contains(args, "--log-level="+level) {
		t.Errorf("the new cube-node Pod does not run with --log-level=%s: %q", level, args)
	}
	f.verify(t, "the red-line upgrade")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)

	pod = recreate(t, "helm upgrade back to the values file", f, func(ctx context.Context) error {
		_, err := helmUpgrade(ctx)
		return err
	})
	f.verify(t, "the upgrade back")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)
}
