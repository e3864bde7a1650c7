package integration

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/promtest"
)

// TestMetricsOfCubeUp scrapes `cube up --metrics-listen` after creates, a
// kill and sandbox traffic, then again after a SIGKILL and restart: the
// API, node and cluster metrics moved as they should, the access log has
// one line per API request and none for sandbox traffic.
func TestMetricsOfCubeUp(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(n.freePort()))
	n.extra = []string{"--metrics-listen", metricsAddr}
	n.start()

	var sbs []*sandbox
	for range 2 {
		sb, err := n.create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	// Sandbox traffic through the proxy.
	if out, err := n.run(ctx, sbs[0], "echo hi"); err != nil || strings.TrimSpace(out) != "hi" {
		t.Fatalf("run: %q %v", out, err)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+n.listen+"/sandboxes/"+sbs[1].ID, nil)
	req.Header.Set("X-API-Key", n.key)
	req.Header.Set("X-Request-Id", "it-kill-1")
	res, err := n.httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent || res.Header.Get("X-Request-Id") != "it-kill-1" {
		t.Fatalf("kill: %s, X-Request-Id %q", res.Status, res.Header.Get("X-Request-Id"))
	}

	m := scrape(t, n, metricsAddr)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"cube_api_request_duration_seconds", []string{"route", "POST /sandboxes", "code", "201"}, 2},
		{"cube_api_request_duration_seconds", []string{"route", "DELETE /sandboxes/{sandboxID}", "code", "204"}, 1},
		{"cube_cubelet_sandbox_create_duration_seconds", []string{"path", "cold", "template", "base"}, 2},
		{"cube_cubelet_pool_misses_total", []string{"template", "base"}, 2},
		{"cube_cubelet_sandbox_kill_duration_seconds", nil, 1},
		{"cube_cubelet_sandboxes", []string{"state", "running"}, 1},
		{"cube_cubelet_host_ports_used", nil, 1},
		{"cube_cubelet_host_ports", nil, 100},
		{"cube_nodes", []string{"state", "Ready"}, 1},
		{"cube_sandboxes", []string{"state", "running", "node", "local"}, 1},
		{"cube_cubelet_reconcile_sandboxes", []string{"outcome", "adopted"}, 0},
	} {
		if got := m.Value(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// The store timed the creates' records (a transaction each), the
	// kill's delete and the API key check (cached after the first).
	for _, c := range []struct {
		op, outcome string
		atLeast     float64
	}{
		{"tx_insert_sandboxes", "ok", 2},
		{"delete_sandboxes", "ok", 1},
		{"select_api_keys", "ok", 1},
	} {
		if got := m.Value("cube_store_query_duration_seconds", "operation", c.op, "outcome", c.outcome); got < c.atLeast {
			t.Errorf("cube_store_query_duration_seconds{operation=%q,outcome=%q} = %v, want >= %v", c.op, c.outcome, got, c.atLeast)
		}
	}
	// The scheduler's count catches up with a kill at the next recount
	// (the node's heartbeat, every 2 s).
	for deadline := time.Now().Add(10 * time.Second); m.Value("cube_node_sandboxes", "node", "local") != 1; m = scrape(t, n, metricsAddr) {
		if time.Now().After(deadline) {
			t.Errorf("cube_node_sandboxes{node=local} = %v, want 1", m.Value("cube_node_sandboxes", "node", "local"))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Only API requests are in the access log: 2 creates and the kill
	// (health polls are at debug), not the proxied envd calls.
	log, _ := os.ReadFile(filepath.Join(n.dir, "cube.log"))
	var access []string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "msg=request ") {
			access = append(access, l)
		}
	}
	if len(access) != 3 {
		t.Errorf("%d access-log lines, want 3:\n%s", len(access), strings.Join(access, "\n"))
	}
	found := false
	for _, l := range access {
		found = found || (strings.Contains(l, "requestId=it-kill-1") && strings.Contains(l, `route="DELETE /sandboxes/{sandboxID}"`) &&
			strings.Contains(l, "status=204") && strings.Contains(l, "sandbox="+sbs[1].ID) && strings.Contains(l, "apiKeyId="))
	}
	if !found {
		t.Errorf("no access-log line for the kill:\n%s", strings.Join(access, "\n"))
	}

	// A restart reconciles the surviving sandbox: adopted.
	n.kill()
	n.start()
	m = scrape(t, n, metricsAddr)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"cube_cubelet_reconcile_sandboxes", []string{"outcome", "adopted"}, 1},
		{"cube_cubelet_reconcile_sandboxes", []string{"outcome", "dead"}, 0},
		{"cube_cubelet_sandboxes", []string{"state", "running"}, 1},
		{"cube_sandboxes", []string{"state", "running", "node", "local"}, 1},
	} {
		if got := m.Value(c.name, c.labels...); got != c.want {
			t.Errorf("after restart: %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// scrape parses the /metrics page served at addr.
func scrape(t *testing.T, n *node, addr string) promtest.Families {
	t.Helper()
	return promtest.Scrape(t, n.httpClient, "http://"+addr+"/metrics")
}

// TestWarmPoolExhaustionMetrics runs a fixed pool of two dry: four creates
// at once take both ready slots and the rest run cold. The scrape counts
// them as hits and misses, and the create histogram by path agrees.
func TestWarmPoolExhaustionMetrics(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(n.freePort()))
	n.extra = []string{"--metrics-listen", metricsAddr, "--pool-size", "2"}
	n.start()

	m := scrape(t, n, metricsAddr)
	for deadline := time.Now().Add(60 * time.Second); m.Value("cube_cubelet_pool_ready_slots", "template", "base") != 2; m = scrape(t, n, metricsAddr) {
		if time.Now().After(deadline) {
			t.Fatalf("pool never ready: ready %v, target %v", m.Value("cube_cubelet_pool_ready_slots", "template", "base"),
				m.Value("cube_cubelet_pool_target_slots", "template", "base"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := m.Value("cube_cubelet_pool_target_slots", "template", "base"); got != 2 {
		t.Fatalf("pool target %v, want 2", got)
	}

	const creates = 4
	errs := make(chan error, creates)
	for range creates {
		go func() {
			_, err := n.create(ctx)
			errs <- err
		}()
	}
	for range creates {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	m = scrape(t, n, metricsAddr)
	hits := m.Value("cube_cubelet_pool_hits_total", "template", "base")
	misses := m.Value("cube_cubelet_pool_misses_total", "template", "base")
	// A slot refilled in the meantime may serve a third create; at least
	// one of four against a pool of two runs cold.
	if hits < 2 || misses < 1 || hits+misses != creates {
		t.Fatalf("pool hits %v, misses %v after %d creates against 2 ready slots", hits, misses, creates)
	}
	// Value is -1 for a path with no series yet.
	warm := max(0, m.Value("cube_cubelet_sandbox_create_duration_seconds", "path", "prestarted", "template", "base")) +
		max(0, m.Value("cube_cubelet_sandbox_create_duration_seconds", "path", "pool", "template", "base"))
	if cold := m.Value("cube_cubelet_sandbox_create_duration_seconds", "path", "cold", "template", "base"); warm != hits || cold != misses {
		t.Errorf("creates by path: warm %v, cold %v; want %v and %v (the hits and misses)", warm, cold, hits, misses)
	}
	// The pool refills to its target.
	for deadline := time.Now().Add(60 * time.Second); m.Value("cube_cubelet_pool_ready_slots", "template", "base") != 2; m = scrape(t, n, metricsAddr) {
		if time.Now().After(deadline) {
			t.Fatalf("pool not refilled: ready %v", m.Value("cube_cubelet_pool_ready_slots", "template", "base"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
