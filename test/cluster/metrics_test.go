package cluster_test

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/grafanatest"
	"github.com/cube-dev/cube/internal/promtest"
)

// TestClusterMetrics scrapes `cube server --metrics-listen` and `cube
// cubelet --metrics-listen` after creates, kills and a cubelet restart
// over a live sandbox, parsing both with the Prometheus text parser.
func TestClusterMetrics(t *testing.T) {
	c := newCluster(t)
	serverMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c.server.Kill(syscall.SIGTERM)
	c.serverArgs = append(c.serverArgs, "--metrics-listen", serverMetrics)
	c.restartServer()
	n := c.addNode("node-m")

	kept, gone := c.create(), c.create()
	c.call(http.MethodDelete, "/sandboxes/"+gone, nil, nil, http.StatusNoContent)

	// The cubelet again, now with metrics, over the live sandbox.
	nodeMetrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n.p.Kill(syscall.SIGKILL)
	n.args = append(n.args, "--metrics-listen", nodeMetrics)
	c.restartNode(n)
	c.waitFor("restarted cubelet registered", 30*time.Second, func() bool { code, _ := readyz(n); return code == http.StatusOK })
	c.waitState(n.id, "Ready", 30*time.Second)
	third := c.create()
	c.call(http.MethodDelete, "/sandboxes/"+third, nil, nil, http.StatusNoContent)

	node := scrapeMetrics(t, nodeMetrics)
	for _, ck := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"cube_cubelet_reconcile_sandboxes", []string{"outcome", "adopted"}, 1},
		{"cube_cubelet_sandbox_kill_duration_seconds", nil, 1},
		{"cube_cubelet_sandboxes", []string{"state", "running"}, 1},
		{"cube_cubelet_host_ports", nil, 20},
		{"cube_cubelet_host_ports_used", nil, 1},
	} {
		if got := node.Value(ck.name, ck.labels...); got != ck.want {
			t.Errorf("cubelet: %s%v = %v, want %v (%v)", ck.name, ck.labels, got, ck.want, node[ck.name].GetMetric())
		}
	}
	// One create since the restart: from a plain pool slot when the pool
	// (plain slots: the pool template base is not on this node) had one
	// ready, else cold; hits and misses agree.
	pool := max(0, node.Value("cube_cubelet_sandbox_create_duration_seconds", "path", "pool", "template", "tiny"))
	cold := max(0, node.Value("cube_cubelet_sandbox_create_duration_seconds", "path", "cold", "template", "tiny"))
	hits := max(0, node.Value("cube_cubelet_pool_hits_total", "template", "tiny"))
	misses := max(0, node.Value("cube_cubelet_pool_misses_total", "template", "tiny"))
	if pool+cold != 1 || hits != pool || misses != cold {
		t.Errorf("creates: pool %v cold %v, hits %v misses %v; want one create, hits = pool, misses = cold", pool, cold, hits, misses)
	}
	// The pool template base is missing here: its target keeps plain
	// slots meanwhile, counted for it. Idle, the target is the default
	// floor within the default budget (host memory / 16 at 16 MiB a slot).
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	budgetSlots := cubelet.DefaultPoolMemoryMB(int64(si.Totalram)*int64(si.Unit)>>20) / 16 // 16 MiB a slot
	if want := float64(min(cubelet.DefaultPoolFloor, budgetSlots)); node.Value("cube_cubelet_pool_target_slots", "template", "base") != want ||
		node.Value("cube_cubelet_pool_ready_slots", "template", "base") < 0 {
		t.Errorf("pool target %v ready %v; want target %v", node["cube_cubelet_pool_target_slots"].GetMetric(), node["cube_cubelet_pool_ready_slots"].GetMetric(), want)
	}
	if node.Value("cube_api_request_duration_seconds") != -1 || node.Value("cube_nodes", "state", "Ready") != -1 {
		t.Error("the cubelet exports control-plane metrics")
	}

	srv := scrapeMetrics(t, serverMetrics)
	for _, ck := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"cube_api_request_duration_seconds", []string{"route", "POST /v2/sandboxes", "code", "201"}, 3},
		{"cube_api_request_duration_seconds", []string{"route", "DELETE /sandboxes/{sandboxID}", "code", "204"}, 2},
		{"cube_nodes", []string{"state", "Ready"}, 1},
		{"cube_nodes", []string{"state", "Down"}, 0},
		{"cube_sandboxes", []string{"state", "running", "node", n.id}, 1},
	} {
		if got := srv.Value(ck.name, ck.labels...); got != ck.want {
			t.Errorf("server: %s%v = %v, want %v", ck.name, ck.labels, got, ck.want)
		}
	}
	if age := srv.Value("cube_node_heartbeat_age_seconds", "node", n.id); age < 0 || age > 5 {
		t.Errorf("heartbeat age %v, want 0-5 s", age)
	}
	if srv.Value("cube_cubelet_sandboxes", "state", "running") != -1 {
		t.Error("the server exports node metrics")
	}
	// Every series the Grafana dashboard queries is in one of the scrapes
	// (test/integration checks cube up the same way).
	d, err := grafanatest.Load("../../deploy/kubernetes/chart/dashboards/cube.json")
	if err != nil {
		t.Fatal(err)
	}
	if missing := promtest.Missing(d.Series("cube_"), srv, node); len(missing) > 0 {
		t.Errorf("the dashboard queries series neither cube server nor cube cubelet exports: %v", missing)
	}
	// Heartbeats are counted under the registry's route, not logged at info.
	heartbeats := 0.0
	for _, m := range srv["cube_api_request_duration_seconds"].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "route" && strings.Contains(lp.GetValue(), "RegistryService") {
				heartbeats += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	if heartbeats < 1 {
		t.Error("no node registry requests counted")
	}
	for _, l := range strings.Split(c.server.Read(), "\n") {
		if strings.Contains(l, "msg=request") && strings.Contains(l, "RegistryService") {
			t.Errorf("a heartbeat in the access log at info: %s", l)
			break
		}
	}
	if log := c.server.Read(); !strings.Contains(log, "msg=request component=access") || !strings.Contains(log, "sandbox="+kept) {
		t.Errorf("no access-log line for the create of %s:\n%s", kept, c.server.Tail())
	}
}

// scrapeMetrics parses the /metrics page served at addr.
func scrapeMetrics(t *testing.T, addr string) promtest.Families {
	t.Helper()
	return promtest.Scrape(t, nil, "http://"+addr+"/metrics")
}
