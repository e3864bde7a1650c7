// Package kubereal tests Cube's Helm chart on the real single-node
// Kubernetes cluster that `make kube-up` starts on this machine (a real
// kubelet, containerd and runc): the official e2b SDK through the
// cube-server Service, sandboxes surviving recreations of the Big Pod
// (kubectl delete, red-line upgrades, a hostNetwork flip, a cubelet image
// bump), policy-only upgrades that leave it alone, the node controller and
// uninstall. docs/kubernetes/testing.md describes it.
package kubereal

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestKubeReal runs the scenarios in an order that keeps the shared state
// meaningful: the counter sandboxes are made once and carried through the
// Big Pod events; the drain kills them; uninstall (which re-installs) comes
// last. Each scenario restores the release it changed, so a failing one
// leaves the cluster usable for the next; each can run alone with
// -run 'TestKubeReal/<name>'.
func TestKubeReal(t *testing.T) {
	requireCluster(t)
	t.Cleanup(func() {
		logTimings(t)
		sweepSandboxes(t)
	})
	for _, s := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"SDK", testSDK},
		{"BigPodDelete", testBigPodDelete},
		{"RedLineUpgrade", testRedLineUpgrade},
		{"HostNetworkFlip", testHostNetworkFlip},
		{"CubeletImageBump", testCubeletImageBump},
		{"PolicyOnlyUpgrade", testPolicyOnlyUpgrade},
		{"NodeController", testNodeController},
		{"Uninstall", testUninstall},
	} {
		t.Run(s.name, func(t *testing.T) {
			diagnoseOnFailure(t)
			start := time.Now()
			s.run(t)
			t.Logf("%s took %v", s.name, time.Since(start).Round(time.Second))
		})
	}
}

// testSDK runs test/e2e's SDK suite (lifecycle: create, list, connect,
// timeouts, kill; commands; files) through the cube-server Service.
func testSDK(t *testing.T) {
	ctx, cancel := context.WithTimeout(testCtx(t), 15*time.Minute)
	defer cancel()
	files := []string{"lifecycle.test.mjs", "commands.test.mjs", "files.test.mjs"}
	args := append([]string{"--test", "--test-concurrency=2", "--test-timeout=180000"}, files...)
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = env.E2EDir
	// The suite's leak list is run.sh's business; here the suite's own
	// sweep kills what it made.
	cmd.Env = append(os.Environ(), "CUBE_E2E_IDS_FILE="+filepath.Join(t.TempDir(), "ids"))
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("e2b SDK suite (node --test %v in %s) through %s failed: %v\n%s", files, env.E2EDir, env.APIURL, err, tail(string(out), 200))
	}
	t.Logf("e2b SDK suite through the cube-server Service (%s):\n%s", env.APIURL, tail(string(out), 12))
}
