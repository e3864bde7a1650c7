package cluster_test

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/yaml"

	cubecluster "github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/preflight"
)

const chartDir = "../../deploy/kubernetes/chart"

// TestNodeHealthReportedAndHelmTest: a real cubelet reports that its API
// answers its own call and the newest record of its prep dir; GET /nodes
// shows both; the chart's cube-test-node-health script, run with bash
// against the real server, passes for the reported generation and fails,
// naming the node and what to check, for another one or a failed prep.
func TestNodeHealthReportedAndHelmTest(t *testing.T) {
	c := newCluster(t)
	prepDir := filepath.Join(c.dir, "node-h", "prep")
	fp, err := preflight.NewFingerprint(3, "node-h", "test", "6.1", preflight.Report{Passed: true, Runtime: "ns"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := preflight.WriteFingerprint(prepDir, fp); err != nil {
		t.Fatal(err)
	}
	c.addNode("node-h")

	h := c.waitHealth("node-h", func(h *cubecluster.NodeHealth) bool { return h.Preflight.State == cubecluster.PrepPassed })
	if !h.Socket.Serving || !strings.HasPrefix(h.Socket.Address, "http://127.0.0.1:") || h.Preflight.Generation != 3 ||
		!h.Preflight.At.Equal(fp.CreatedAt.Truncate(time.Millisecond)) {
		t.Fatalf("reported health: %+v", h)
	}
	if out, err := c.cube("node", "ls"); err != nil || !strings.Contains(out, "HEALTH") || !strings.Contains(out, "ok gen 3") {
		t.Fatalf("cube node ls: %v\n%s", err, out)
	}
	if out, err := c.runHelmTest(t, "cubeNodeBootstrap: {prepGeneration: 3}"); err != nil ||
		!strings.Contains(out, "node node-h: cubelet API answers") || !strings.Contains(out, "generation 3 passed") {
		t.Fatalf("helm test for generation 3: %v\n%s", err, out)
	}
	out, err := c.runHelmTest(t, "cubeNodeBootstrap: {prepGeneration: 4}\ntests: {nodeReadyTimeoutSeconds: 1}")
	if err == nil || !strings.Contains(out, "node node-h: preflight passed for prep generation 3, want 4") ||
		!strings.Contains(out, "cube-node-bootstrap") {
		t.Fatalf("helm test for generation 4 (node has 3): %v\n%s", err, out)
	}

	// cube prep of generation 4 fails (a /30 is too small for sandboxes):
	// it records the failure, the cubelet reports it with the failing check.
	prep := exec.Command(filepath.Join(binDir, "cube"), "prep", "--generation", "4", "--dir", prepDir,
		"--run-dir", filepath.Join(c.dir, "prep-run"), "--node-cidr", "10.250.0.0/30", "--node", "node-h")
	if b, err := prep.CombinedOutput(); err == nil {
		t.Fatalf("cube prep with a /30 passed:\n%s", b)
	}
	h = c.waitHealth("node-h", func(h *cubecluster.NodeHealth) bool { return h.Preflight.State == cubecluster.PrepFailed })
	if h.Preflight.Generation != 4 || !strings.Contains(strings.Join(h.Preflight.FailedChecks, "\n"), "network.node-cidr: ") {
		t.Fatalf("reported failed prep: %+v", h.Preflight)
	}
	out, err = c.runHelmTest(t, "cubeNodeBootstrap: {prepGeneration: 4}\ntests: {nodeReadyTimeoutSeconds: 1}")
	if err == nil || !strings.Contains(out, "preflight of prep generation 4 failed") || !strings.Contains(out, "network.node-cidr") {
		t.Fatalf("helm test after a failed prep: %v\n%s", err, out)
	}
	// The socket alone still passes (bootstrap disabled).
	if out, err := c.runHelmTest(t, "cubeNodeBootstrap: {enabled: false}"); err != nil {
		t.Fatalf("socket-only helm test: %v\n%s", err, out)
	}
}

// waitHealth polls GET /nodes until the node reports health that ok accepts.
func (c *cluster) waitHealth(id string, ok func(*cubecluster.NodeHealth) bool) *cubecluster.NodeHealth {
	c.t.Helper()
	var got *cubecluster.NodeHealth
	c.waitFor("health of "+id, 20*time.Second, func() bool {
		var nodes []cubecluster.NodeStatus
		c.call(http.MethodGet, "/nodes", nil, &nodes, 200)
		for _, n := range nodes {
			if n.ID == id && n.Health != nil && ok(n.Health) {
				got = n.Health
				return true
			}
		}
		return false
	})
	return got
}

// runHelmTest renders the chart with values and runs the script of its
// cube-test-node-health Job with bash, as the Job would, with the test's
// cube binary in place of the image's.
func (c *cluster) runHelmTest(t *testing.T, values string) (string, error) {
	t.Helper()
	script := strings.ReplaceAll(helmTestScript(t, values, "tests/node-health.yaml"), "/usr/local/bin/cube", filepath.Join(binDir, "cube"))
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), "CUBE_SERVER="+c.url, "CUBE_API_KEY="+c.key)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("helm test script (values %q) exited after %s with %v:\n%s", values, time.Since(start).Round(time.Millisecond), err, out)
	return string(out), err
}

// helmTestScript renders one helm test template of the chart (release
// "cube" in cube-system) and returns its Job's bash script.
func helmTestScript(t *testing.T, values, tmpl string) string {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValues([]byte(values))
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "cube", Namespace: "cube-system", Revision: 1, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatal(err)
	}
	var job batchv1.Job
	if err := yaml.Unmarshal([]byte(files["cube/templates/"+tmpl]), &job); err != nil {
		t.Fatal(err)
	}
	cs := job.Spec.Template.Spec.Containers
	if len(cs) != 1 || len(cs[0].Args) != 1 {
		t.Fatalf("%s: unexpected Job shape: %+v", tmpl, cs)
	}
	return cs[0].Args[0]
}
