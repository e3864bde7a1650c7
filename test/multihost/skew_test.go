package multihost_test

import (
	"strings"
	"testing"
	"time"
)

// TestVersionSkew runs a v0.5.0 server with cubelets of other versions: one
// minor older is admitted (rolling upgrades); two minors older and newer
// are refused at registration with an error naming both versions, and are
// not listed.
func TestVersionSkew(t *testing.T) {
	tp := newTopo(t)
	c := newCluster(t, tp)
	c.bin = cubeBinary(t, "v0.5.0")
	c.addServer("srv", 1)
	cases := []struct {
		node, version string
		ok            bool
	}{
		{"n1", "v0.4.0", true},  // one minor older: supported
		{"n2", "v0.3.0", false}, // two minors older
		{"n3", "v0.6.0", false}, // newer than the server
	}
	for i, tc := range cases {
		c.addNode(tc.node, 11+i, cubeBinary(t, tc.version))
	}
	c.waitState("n1", "Ready", readyTimeout)
	for _, tc := range cases[1:] {
		n := c.nodes[tc.node]
		c.waitFor("cubelet "+tc.version+" to log its refusal", 30*time.Second, func() bool {
			return strings.Contains(n.p.logText(), "is not supported by server version")
		})
		var line string
		for _, l := range strings.Split(n.p.logText(), "\n") {
			if strings.Contains(l, "is not supported by server version") {
				line = l
				break
			}
		}
		t.Logf("cubelet %s: %s", tc.version, line)
		if !strings.Contains(line, tc.version) || !strings.Contains(line, "v0.5.0") {
			t.Errorf("refusal of cubelet %s does not name both versions: %s", tc.version, line)
		}
	}
	ls := c.nodeLs()
	for _, tc := range cases {
		st, listed := ls[tc.node]
		switch {
		case tc.ok && (!listed || st.Version != tc.version || st.State != "Ready"):
			t.Errorf("cubelet %s: %+v (listed %v), want Ready with version %s", tc.version, st, listed, tc.version)
		case !tc.ok && listed:
			t.Errorf("refused cubelet %s is listed: %+v", tc.version, st)
		}
	}
	if out, err := c.cube(30*time.Second, "node", "ls"); err == nil {
		t.Logf("cube node ls:\n%s", out)
	}
	// The admitted older cubelet runs sandboxes.
	id := c.mustCreate(60)
	if code := c.envdHealth(id); code != 204 {
		t.Errorf("sandbox on the v0.4.0 cubelet: envd /health %d", code)
	}
}
