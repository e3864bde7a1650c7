package cluster_test

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readyz is the cubelet's GET /readyz: status and body.
func readyz(n *nodeProc) (int, string) {
	res, err := http.Get("http://" + n.listen + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, strings.TrimSpace(string(b))
}

// TestCubeletReadyzFollowsServer: the cube-node Pod's readiness probe
// (GET /readyz) says Ready only while the server has the node's current
// registration; an open listener is not enough. Before, the chart probed
// the TCP port, which opened before the registration (issue 20: a create
// right after a hostNetwork flip went to the Pod's old address).
func TestCubeletReadyzFollowsServer(t *testing.T) {
	c := newCluster(t)
	n := c.addNode("node-r")
	wantReadyz := func(what string, code int, body string) {
		t.Helper()
		var got int
		var msg string
		c.waitFor(what, 30*time.Second, func() bool {
			got, msg = readyz(n)
			return got == code && strings.Contains(msg, body)
		})
		t.Logf("%s: %d %s", what, got, msg)
	}
	wantReadyz("readyz of a registered node", 200, "registered with "+c.url)

	// The server goes away: the node is not Ready (it cannot take creates)
	// but keeps serving its API; back when the server is.
	c.server.Kill(syscall.SIGKILL)
	wantReadyz("readyz with the server gone", 503, "lost the server")
	c.restartServer()
	wantReadyz("readyz after the server came back", 200, "registered with "+c.url)

	// A cubelet the server refuses (wrong API key) listens but is never
	// Ready, and says why.
	n.p.Kill(syscall.SIGTERM)
	i := slices.Index(n.args, "--api-key")
	n.args[i+1] = "wrong-key"
	c.restartNode(n)
	wantReadyz("readyz of a refused node", 503, "not registered with the server")
	if _, msg := readyz(n); !strings.Contains(strings.ToLower(msg), "unauthenticated") && !strings.Contains(msg, "API key") {
		t.Errorf("refused registration: readyz does not say why: %q", msg)
	}
}
