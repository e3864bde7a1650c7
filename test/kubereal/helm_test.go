package kubereal

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// helmTimeout bounds a helm call that waits for a rollout.
const helmTimeout = 12 * time.Minute

// testCtx is the test's context, or a fresh one in cleanups (where the
// test's context is already canceled).
func testCtx(t *testing.T) context.Context {
	if ctx := t.Context(); ctx.Err() == nil {
		return ctx
	}
	return context.Background()
}

// helmUpgrade upgrades the release with the values file kube-up installed
// it with plus sets (no --reuse-values: every upgrade starts from that
// file, so restoring is an upgrade with no sets). It does not wait for the
// rollout; callers observe it.
func helmUpgrade(ctx context.Context, sets ...string) (string, error) {
	args := []string{"upgrade", env.Release, env.Chart, "-n", env.Namespace, "-f", env.Values, "--timeout", "10m"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return run(ctx, helmTimeout, "helm", args...)
}

func mustHelmUpgrade(t *testing.T, sets ...string) string {
	t.Helper()
	t.Logf("$ helm upgrade %s %s -f %s --set %s", env.Release, env.Chart, env.Values, strings.Join(sets, " --set "))
	out, err := helmUpgrade(testCtx(t), sets...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// releaseValues are the computed values of the live release.
func releaseValues(t *testing.T) map[string]any {
	t.Helper()
	out, err := run(testCtx(t), cmdTimeout, "helm", "get", "values", env.Release, "-n", env.Namespace, "-a", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("decode helm get values: %v", err)
	}
	return v
}

// valueAt walks a dotted path through values.
func valueAt(v map[string]any, path string) (any, bool) {
	var cur any = v
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func valueString(v map[string]any, path string) string {
	x, ok := valueAt(v, path)
	if !ok || x == nil {
		return ""
	}
	return fmt.Sprint(x)
}

// desiredHostNetwork is cubeNode.hostNetwork of the values file (the
// chart's default, true, when the file does not set it).
func desiredHostNetwork(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile(env.Values)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatalf("parse %s: %v", env.Values, err)
	}
	x, ok := valueAt(v, "cubeNode.hostNetwork")
	if !ok {
		return true
	}
	return x == true
}

// liveHostNetwork is hostNetwork of the live cube-node DaemonSet's template.
func liveHostNetwork(ctx context.Context) (bool, error) {
	out, err := kubectl(ctx, "get", "daemonset", "cube-node", "-o", "jsonpath={.spec.template.spec.hostNetwork}")
	return strings.TrimSpace(out) == "true", err
}

// restoreRelease returns the release to the values file after a test
// changed it (the ack only when the live hostNetwork differs, then once
// more without it, as docs/kubernetes/upgrade.md says), waits for the node
// and checks the fleet, if any, survived the restore.
func restoreRelease(t *testing.T) {
	t.Helper()
	ctx := testCtx(t)
	live, err := liveHostNetwork(ctx)
	if err != nil {
		t.Errorf("restore: %v", err)
		return
	}
	if want := desiredHostNetwork(t); live != want {
		mustHelmUpgrade(t, "cubeNode.hostNetworkChangeAck=true")
	}
	mustHelmUpgrade(t)
	must(t, helmTimeout, "kubectl", "-n", env.Namespace, "rollout", "status", "daemonset/cube-node", "--timeout=10m")
	readyNodePod(t, 5*time.Minute)
	n := waitCubeNodeState(t, "Ready", 3*time.Minute)
	t.Logf("restored the release to %s: cube node %s Ready, version %s", env.Values, n.ID, n.Version)
	if sharedFleet != nil {
		sharedFleet.verify(t, "restoring the release")
	}
}
