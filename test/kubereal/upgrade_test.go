package kubereal

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func sameVersion(a, b string) bool { return strings.TrimPrefix(a, "v") == strings.TrimPrefix(b, "v") }

// waitVersion waits until the node reports version (cube node ls --json).
func waitVersion(t *testing.T, version string) {
	t.Helper()
	waitFor(t, "cube node to report version "+version, 3*time.Minute, time.Second, func(ctx context.Context) (bool, string) {
		n, err := cubeNode(ctx)
		if err != nil {
			return false, err.Error()
		}
		return sameVersion(n.Version, version) && n.State == "Ready", fmt.Sprintf("version %s, state %s", n.Version, n.State)
	})
	t.Logf("cube node ls: node %s reports version %s", env.Node, version)
}

// testCubeletImageBump: a new cubelet image (a second build with another
// version stamp) is a red line; the node comes back reporting the new
// version and no sandbox is lost, and the same on the way back.
func testCubeletImageBump(t *testing.T) {
	f := counterFleet(t)
	t.Cleanup(func() { restoreRelease(t) })
	n, err := cubeNode(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !sameVersion(n.Version, env.ImageTag) {
		t.Errorf("before the bump the node reports version %s, want %s (CUBE_KUBE_IMAGE_TAG)", n.Version, env.ImageTag)
	}
	pod := recreate(t, "images.cubelet.tag="+env.ImageTagNext, f, func(ctx context.Context) error {
		_, err := helmUpgrade(ctx, "images.cubelet.tag="+env.ImageTagNext)
		return err
	})
	if img := cubeletContainer(t, pod).Image; !strings.HasSuffix(img, ":"+env.ImageTagNext) {
		t.Errorf("the new cube-node Pod runs image %s, want tag %s", img, env.ImageTagNext)
	}
	waitVersion(t, env.ImageTagNext)
	f.verify(t, "the cubelet image bump")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)
	logDoctor(t)

	pod = recreate(t, "images.cubelet.tag back to "+env.ImageTag, f, func(ctx context.Context) error {
		_, err := helmUpgrade(ctx)
		return err
	})
	waitVersion(t, env.ImageTag)
	f.verify(t, "the cubelet image going back")
	assertNoOrphans(t, f)
	assertNoRestarts(t, pod)
}

// logDoctor logs `cube node doctor` of the node (its live supervisors and
// their versions, findings); it exits 1 on any problem, which is logged
// rather than failed: the preflight part reports this VM's quirks.
func logDoctor(t *testing.T) {
	t.Helper()
	out, err := run(testCtx(t), cmdTimeout, env.CubeBin, append([]string{"node", "doctor"}, nodeFlags(t)...)...)
	if err != nil {
		t.Logf("cube node doctor: %v", err)
		return
	}
	t.Logf("cube node doctor:\n%s", tail(out, 60))
}

// testPolicyOnlyUpgrade: bumping cubeNodeBootstrap.prepGeneration and the
// installer image rolls cube-node-bootstrap and cube-node-installer only;
// the cube-node Pod (and so cubelet) is the same Pod afterwards, and the
// node reports a passed preflight of the new generation.
func testPolicyOnlyUpgrade(t *testing.T) {
	f := counterFleet(t)
	t.Cleanup(func() { restoreRelease(t) })
	pod := readyNodePod(t, 3*time.Minute)
	gen := dsGeneration(t)
	prep, ok := valueAt(releaseValues(t), "cubeNodeBootstrap.prepGeneration")
	if !ok {
		t.Fatal("the release has no cubeNodeBootstrap.prepGeneration")
	}
	next := int(prep.(float64)) + 1
	mustHelmUpgrade(t, fmt.Sprintf("cubeNodeBootstrap.prepGeneration=%d", next), "images.installer.tag="+env.ImageTagNext)
	for _, ds := range []string{"cube-node-bootstrap", "cube-node-installer"} {
		mustKubectl(t, "rollout", "status", "daemonset/"+ds, "--timeout=5m")
	}
	var installer corev1.PodList
	if err := kubeJSON(testCtx(t), &installer, "get", "pods", "-l", "app.kubernetes.io/component=node-installer"); err != nil {
		t.Fatal(err)
	}
	for _, p := range installer.Items {
		if p.DeletionTimestamp == nil && !strings.HasSuffix(p.Spec.Containers[0].Image, ":"+env.ImageTagNext) {
			t.Errorf("installer Pod %s runs %s, want tag %s", p.Name, p.Spec.Containers[0].Image, env.ImageTagNext)
		}
	}
	waitFor(t, fmt.Sprintf("the node to report a passed preflight of generation %d", next), 3*time.Minute, 2*time.Second,
		func(ctx context.Context) (bool, string) {
			n, err := cubeNode(ctx)
			if err != nil {
				return false, err.Error()
			}
			if n.Health == nil {
				return false, "no health reported"
			}
			p := n.Health.Preflight
			return p.State == "passed" && p.Generation == next, fmt.Sprintf("preflight %s gen %d %v", p.State, p.Generation, p.FailedChecks)
		})
	assertPodKept(t, pod, gen, "the policy-only upgrade (prepGeneration, installer image)")
	f.verify(t, "the policy-only upgrade")

	mustHelmUpgrade(t)
	for _, ds := range []string{"cube-node-bootstrap", "cube-node-installer"} {
		mustKubectl(t, "rollout", "status", "daemonset/"+ds, "--timeout=5m")
	}
	assertPodKept(t, pod, gen, "restoring the policy-only values")
	mustCreateOne(t, "after the policy-only upgrades")
}
