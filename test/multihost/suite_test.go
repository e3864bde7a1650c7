package multihost_test

import (
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/pgtest"
)

// TestCluster is the multi-host suite, once with SQLite (one server) and
// once with PostgreSQL (two servers; the leader is killed mid-run).
func TestCluster(t *testing.T) {
	for _, tc := range []struct {
		name     string
		postgres bool
	}{{"sqlite", false}, {"postgres", true}} {
		t.Run(tc.name, func(t *testing.T) { runSuite(t, tc.postgres) })
	}
}

// Bounds the suite asserts. Down: --node-down-after, then the health loop's
// next tick (1 s) and a failed probe (at most 2 s), plus scheduling slack.
const (
	readyTimeout = 60 * time.Second
	probeSlack   = 1*time.Second + 2*time.Second + 2*time.Second
	handover     = 15 * time.Second // docs/ha.md, issue 4
)

func runSuite(t *testing.T, ha bool) {
	began := time.Now()
	tp := newTopo(t)
	c := newCluster(t, tp)
	if ha {
		// PostgreSQL listens on the test netns's loopback (internal/pgtest);
		// the servers, in their own netns, reach it through a relay on the
		// test's bridge address.
		pg := pgtest.New(t)
		u, err := url.Parse(pg.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		u.Host = relay(t, tp.hostIP+":0", u.Host)
		c.db = u.String()
	}
	srv := c.addServer("srv", 1)
	if ha {
		// Let srv win both locks (TTL expiry, cluster health) before the
		// follower starts, so the test knows whom to kill.
		c.waitFor("srv to lead", 30*time.Second, func() bool {
			return strings.Count(srv.p.logText(), "leadership acquired") >= 2
		})
		c.addServer("srv2", 2)
	}
	nodes := []string{"n1", "n2", "n3"}
	for i, id := range nodes {
		c.addNode(id, 11+i, "")
	}
	for _, id := range nodes {
		c.waitState(id, "Ready", readyTimeout)
	}
	n1, n2, n3 := c.nodes["n1"], c.nodes["n2"], c.nodes["n3"]
	t.Logf("setup: %s", time.Since(began).Round(time.Millisecond))

	// 60 sandboxes spread over the three nodes.
	step := time.Now()
	ids := c.createMany(60, 6)
	t.Logf("60 creates: %s", time.Since(step).Round(time.Millisecond))
	ls := c.nodeLs()
	total := 0
	for _, id := range nodes {
		st := ls[id]
		t.Logf("node %s: %s %s, %d sandboxes", id, st.State, st.Version, st.Sandboxes)
		if st.State != "Ready" || st.Version == "" {
			t.Errorf("node %s: state %q version %q", id, st.State, st.Version)
		}
		if st.Sandboxes < 10 {
			t.Errorf("spread: node %s has %d of 60 sandboxes, want at least 10", id, st.Sandboxes)
		}
		if got := len(c.nodes[id].local()); got != st.Sandboxes {
			t.Errorf("node %s: server counts %d sandboxes, the node holds %d", id, st.Sandboxes, got)
		}
		total += st.Sandboxes
	}
	if total != 60 {
		t.Fatalf("nodes report %d sandboxes in all, want 60", total)
	}
	for _, id := range ids {
		if code := c.envdHealth(id); code != http.StatusNoContent {
			t.Fatalf("envd /health of %s through the proxy: %d", id, code)
		}
	}
	alive := set(ids...)

	// Isolate n1: ten more sandboxes, none on n1.
	if out, err := c.cube(30*time.Second, "node", "isolate", "n1"); err != nil || !strings.Contains(out, "Isolated") {
		t.Fatalf("isolate n1: %v %s", err, out)
	}
	onN1 := n1.local()
	more := c.createMany(10, 4)
	for _, id := range more {
		if n1.local()[id] {
			t.Errorf("sandbox %s was placed on isolated n1", id)
		}
		if !n2.local()[id] && !n3.local()[id] {
			t.Errorf("sandbox %s is on no node", id)
		}
		alive[id] = true
	}
	if st := c.nodeLs()["n1"]; st.State != "Isolated" || st.Sandboxes != len(onN1) {
		t.Errorf("n1 after isolate: %+v, want Isolated with %d sandboxes", st, len(onN1))
	}

	// Drain n2 (kill after 2 s): progress is printed, its sandboxes end.
	onN2 := n2.local()
	step = time.Now()
	out, err := c.cube(120*time.Second, "node", "drain", "n2", "--policy", "kill", "--grace", "2s")
	t.Logf("drain n2 (%s):\n%s", time.Since(step).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("drain n2: %v\n%s", err, c.logs())
	}
	lines := strings.Split(out, "\n")
	if len(lines) < 2 || !strings.Contains(lines[0], "grace") || !strings.Contains(lines[len(lines)-1], "done") {
		t.Errorf("drain progress: want a grace line first and a done line last, got:\n%s", out)
	}
	// n2 is isolated from the drain's start, so its count can only fall by
	// the drain's kills: a line still saying "grace" with fewer sandboxes
	// than the first reports the killing phase as grace.
	first := drainLeft(lines[0])
	for _, l := range lines[1:] {
		if strings.Contains(l, "drain grace") && drainLeft(l) < first {
			t.Errorf("drain progress says grace while sandboxes are being killed: %q (first line %q)", l, lines[0])
			break
		}
	}
	for id := range onN2 {
		if code := c.sandboxCode(id); code != http.StatusNotFound {
			t.Errorf("drained sandbox %s: GET %d, want 404", id, code)
		}
		delete(alive, id)
	}
	c.waitFor("n2 to hold no sandbox", 15*time.Second, func() bool { return len(n2.local()) == 0 })
	if st := c.nodeLs()["n2"]; st.State != "Draining" || st.Sandboxes != 0 {
		t.Errorf("n2 after drain: %+v, want Draining with 0 sandboxes", st)
	}

	if ha {
		leaderHandover(t, c, alive)
	}

	// n3's cubelet dies: Down in time, no placement, its sandboxes reported.
	onN3 := n3.local()
	n3.p.kill(syscall.SIGKILL)
	took := c.waitState("n3", "Down", c.downAfter+30*time.Second)
	t.Logf("n3 Down %s after its cubelet was killed", took.Round(time.Millisecond))
	if bound := c.downAfter + probeSlack; took > bound {
		t.Errorf("n3 took %s to be Down, want at most %s (--node-down-after %s)", took, bound, c.downAfter)
	}
	st := c.nodeLs()["n3"]
	if st.State != "Down" || st.Sandboxes != len(onN3) || !strings.Contains(st.Reason, "probe failed") {
		t.Errorf("n3 while down: %+v, want Down with %d sandboxes and a probe-failed reason", st, len(onN3))
	}
	if lsText, err := c.cube(30*time.Second, "node", "ls"); err == nil {
		t.Logf("cube node ls:\n%s", lsText)
	}
	if code, body := c.call(http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "tiny"}, nil); code != http.StatusServiceUnavailable {
		t.Errorf("create with n1 isolated, n2 draining, n3 down: %d %s, want 503", code, body)
	} else {
		t.Logf("create refused: %s", strings.TrimSpace(body))
	}
	// Kill three of n3's sandboxes while it is down.
	killed := sortedKeys(onN3)[:3]
	for _, id := range killed {
		if code, body := c.call(http.MethodDelete, "/sandboxes/"+id, nil, nil); code != http.StatusNoContent {
			t.Errorf("kill %s on down n3: %d %s", id, code, body)
		}
		if code := c.sandboxCode(id); code != http.StatusNotFound {
			t.Errorf("killed %s: GET %d, want 404", id, code)
		}
		delete(alive, id)
	}
	// Uncordon n1: creates work again, on n1 (the only Ready node).
	if out, err := c.cube(30*time.Second, "node", "uncordon", "n1"); err != nil {
		t.Fatalf("uncordon n1: %v %s", err, out)
	}
	for _, id := range c.createMany(2, 2) {
		if !n1.local()[id] {
			t.Errorf("sandbox %s created after uncordon is not on n1", id)
		}
		alive[id] = true
	}
	for _, id := range killed {
		if !n3.local()[id] {
			t.Errorf("sandbox %s vanished from n3 while its cubelet was dead", id)
		}
	}

	// n3 comes back: Ready, reconciled (the killed ones removed, the rest
	// answering through the proxy).
	step = time.Now()
	n3.start()
	c.waitState("n3", "Ready", readyTimeout)
	t.Logf("n3 Ready %s after its cubelet restarted", time.Since(step).Round(time.Millisecond))
	c.waitFor("sandboxes killed while n3 was down to be removed from n3", 20*time.Second, func() bool {
		local := n3.local()
		for _, id := range killed {
			if local[id] {
				return false
			}
		}
		return true
	})
	t.Logf("n3 reconciled %s after its cubelet restarted", time.Since(step).Round(time.Millisecond))
	for id := range onN3 {
		if alive[id] {
			if code := c.envdHealth(id); code != http.StatusNoContent {
				t.Errorf("sandbox %s on n3 after its return: envd /health %d", id, code)
			}
		}
	}
	if st := c.nodeLs()["n3"]; st.State != "Ready" || st.Sandboxes != len(onN3)-len(killed) {
		t.Errorf("n3 after its return: %+v, want Ready with %d sandboxes", st, len(onN3)-len(killed))
	}
	if got := c.listIDs(); !sameSet(got, alive) {
		t.Errorf("server lists %d sandboxes, want %d (missing %v, extra %v)", len(got), len(alive), minus(alive, got), minus(got, alive))
	}
	t.Logf("suite: %s", time.Since(began).Round(time.Millisecond))
}

// leaderHandover kills the leading server mid-run. The other replica must
// take over the TTL expiry loop within the handover bound (a sandbox that
// expires right after the kill is killed on its node) and lose no record; node
// health is checked by the Down detection that follows.
func leaderHandover(t *testing.T, c *cluster, alive map[string]bool) {
	n3 := c.nodes["n3"]
	short := c.mustCreate(4) // n1 isolated, n2 draining: lands on n3
	if !n3.local()[short] {
		t.Fatalf("short-lived sandbox %s is not on n3", short)
	}
	leader, follower := c.servers[0], c.servers[1]
	killedAt := time.Now()
	leader.p.kill(syscall.SIGKILL)
	c.url = follower.url
	c.waitFor("the new leader to kill the expired sandbox", handover+5*time.Second, func() bool {
		return c.sandboxCode(short) == http.StatusNotFound && !n3.local()[short]
	})
	took := time.Since(killedAt)
	t.Logf("leader killed; expired sandbox killed by %s %s later", follower.name, took.Round(time.Millisecond))
	if took > handover {
		t.Errorf("handover: expired sandbox killed %s after the leader was killed, want within %s", took, handover)
	}
	if !strings.Contains(follower.p.logText(), "leadership acquired") {
		t.Errorf("%s never logged leadership acquired", follower.name)
	}
	if got := c.listIDs(); !sameSet(got, alive) {
		t.Errorf("after the handover %s lists %d sandboxes, want %d (missing %v)", follower.name, len(got), len(alive), minus(alive, got))
	}
	// The surviving nodes keep their state through the handover (their
	// cubelets fail over to the follower).
	time.Sleep(c.downAfter + 2*time.Second)
	ls := c.nodeLs()
	if ls["n1"].State != "Isolated" || ls["n2"].State != "Draining" || ls["n3"].State != "Ready" {
		t.Errorf("nodes after the handover: n1 %s, n2 %s, n3 %s (want Isolated, Draining, Ready)\n%s",
			ls["n1"].State, ls["n2"].State, ls["n3"].State, c.logs())
	}
}

func set(ids ...string) map[string]bool {
	m := map[string]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sameSet(a, b map[string]bool) bool { return len(minus(a, b)) == 0 && len(minus(b, a)) == 0 }

func minus(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// drainLeft reads "N sandboxes left" from a drain progress line (-1 if absent).
func drainLeft(line string) int {
	f := strings.Fields(line)
	for i := 1; i < len(f); i++ {
		if strings.HasPrefix(f[i], "sandboxes") {
			if n, err := strconv.Atoi(f[i-1]); err == nil {
				return n
			}
		}
	}
	return -1
}
