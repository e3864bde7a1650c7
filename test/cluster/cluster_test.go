package cluster_test

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTwoNodeCluster covers registration, spreading, proxying to a remote
// node's host port, isolate/drain/uncordon, a node that disappears and comes
// back with its sandboxes intact, and node delete rules.
func TestTwoNodeCluster(t *testing.T) {
	c := newCluster(t)
	a := c.addNode("node-a")
	b := c.addNode("node-b")

	// Spread: four creates land two per node, all reachable via the proxy.
	var ids []string
	for i := 0; i < 4; i++ {
		ids = append(ids, c.create())
	}
	if na, nb := c.nodeStatus("node-a").Sandboxes, c.nodeStatus("node-b").Sandboxes; na != 2 || nb != 2 {
		t.Fatalf("spread: node-a %d, node-b %d sandboxes", na, nb)
	}
	for _, id := range ids {
		if code := c.envdHealth(id); code != http.StatusNoContent {
			t.Fatalf("envd of %s through the proxy: %d", id, code)
		}
	}

	// Isolate node-a: new sandboxes go to node-b only.
	if out, err := c.cube("node", "isolate", "node-a"); err != nil || !strings.Contains(out, "Isolated") {
		t.Fatalf("isolate: %v %s", err, out)
	}
	c.create()
	if nb := c.nodeStatus("node-b").Sandboxes; nb != 3 {
		t.Fatalf("after isolate node-b has %d sandboxes, want 3", nb)
	}
	// Drain node-a with policy kill and no grace: its sandboxes are killed
	// through the master (404 afterwards), the drain reports done.
	out, err := c.cube("node", "drain", "node-a", "--grace", "0s", "--policy", "kill")
	if err != nil || !strings.Contains(out, "done") {
		t.Fatalf("drain: %v %s", err, out)
	}
	if st := c.nodeStatus("node-a"); st.State != "Draining" || st.Sandboxes != 0 {
		t.Fatalf("after drain: %+v", st)
	}
	alive := 0
	for _, id := range ids {
		var x map[string]any
		req, _ := http.NewRequest(http.MethodGet, c.url+"/sandboxes/"+id, nil)
		req.Header.Set("X-API-Key", c.key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode == 200 {
			alive++
		}
		_ = x
	}
	if alive != 2 {
		t.Fatalf("%d of the first sandboxes alive after draining node-a, want 2 (node-b's)", alive)
	}
	// Delete refuses a non-empty node, accepts the drained one.
	if out, err := c.cube("node", "delete", "node-b"); err == nil {
		t.Fatalf("delete of a Ready node with sandboxes succeeded: %s", out)
	}

	// node-b disappears: Down after missed heartbeats and a failed probe;
	// nothing can be scheduled (node-a is drained).
	b.p.Kill(syscall.SIGKILL)
	c.waitState("node-b", "Down", 20*time.Second)
	if st := c.nodeStatus("node-b"); !strings.Contains(st.Reason, "probe failed") {
		t.Fatalf("down reason: %q", st.Reason)
	}
	c.call(http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "tiny"}, nil, http.StatusServiceUnavailable)
	// Uncordon node-a: creates work again, on node-a.
	if _, err := c.cube("node", "uncordon", "node-a"); err != nil {
		t.Fatal(err)
	}
	c.create()
	if na := c.nodeStatus("node-a").Sandboxes; na != 1 {
		t.Fatalf("after uncordon node-a has %d sandboxes, want 1", na)
	}
	// node-b's cubelet comes back: Ready again, its sandboxes survived the
	// agent's death and answer through the proxy.
	c.restartNode(b)
	c.waitState("node-b", "Ready", 30*time.Second)
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	c.call(http.MethodGet, "/v2/sandboxes", nil, &list, 200)
	if len(list) != 4 {
		t.Fatalf("listed %d sandboxes, want 4", len(list))
	}
	for _, sb := range list {
		if code := c.envdHealth(sb.SandboxID); code != http.StatusNoContent {
			t.Errorf("sandbox %s after node-b's restart: %d", sb.SandboxID, code)
		}
	}
	// Deleting node-a (Ready, one sandbox) needs --force.
	c.cube("node", "isolate", "node-a")
	if _, err := c.cube("node", "delete", "node-a"); err == nil {
		t.Fatal("delete of a non-empty node without --force succeeded")
	}
	if out, err := c.cube("node", "delete", "node-a", "--force"); err != nil {
		t.Fatalf("forced delete: %v %s", err, out)
	}
	c.call(http.MethodGet, "/v2/sandboxes", nil, &list, 200)
	if len(list) != 3 {
		t.Fatalf("after forced delete %d sandboxes listed, want 3", len(list))
	}
	_ = a
	fmt.Fprintln(testingWriter{t}, "cluster ok")
}

type testingWriter struct{ t *testing.T }

func (w testingWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
