package integration

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/grafanatest"
	"github.com/cube-dev/cube/internal/promtest"
)

// dashboardFile is the Grafana dashboard the chart ships.
const dashboardFile = "../../deploy/kubernetes/chart/dashboards/cube.json"

// dashboardSeries returns the Cube series the shipped dashboard queries.
func dashboardSeries(t *testing.T) []string {
	t.Helper()
	d, err := grafanatest.Load(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	series := d.Series("cube_")
	if len(series) < 20 {
		t.Fatalf("the dashboard queries only %d Cube series: %v", len(series), series)
	}
	return series
}

// TestDashboardMetricsOfCubeUp: every series the Grafana dashboard queries
// has a sample in a scrape of `cube up` with a warm pool, after a create
// from the pool and a kill: no panel shows "no data" on a working Cube.
// Series of events that may not have happened yet (template builds, pool
// hits) are there at 0 from the start; this is what keeps them so.
func TestDashboardMetricsOfCubeUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	series := dashboardSeries(t)
	n := newNode(t)
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(n.freePort()))
	n.extra = []string{"--metrics-listen", metricsAddr, "--pool-size", "1"}
	n.start()

	// Before any create: what is missing is what needs a create (the
	// create and kill timings by path and step, sandboxes by node).
	m := scrape(t, n, metricsAddr)
	t.Logf("missing before the first create: %v", promtest.Missing(series, m))

	for deadline := time.Now().Add(time.Minute); m.Value("cube_cubelet_pool_ready_slots", "template", "base") < 1; m = scrape(t, n, metricsAddr) {
		if time.Now().After(deadline) {
			t.Fatalf("no warm-pool slot a minute after start: %v\n%s", m["cube_cubelet_pool_ready_slots"].GetMetric(), n.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
	kept, err := n.create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := n.create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.api(ctx, t, http.MethodDelete, "/sandboxes/"+gone.ID, "", nil)

	m = scrape(t, n, metricsAddr)
	if missing := promtest.Missing(series, m); len(missing) > 0 {
		t.Errorf("the dashboard queries series cube up does not export: %v", missing)
	}
	if got := m.Value("cube_cubelet_pool_hits_total", "template", "base"); got < 1 {
		t.Errorf("pool hits %v after a create with a ready slot, want >= 1", got)
	}
	if got := m.Value("cube_sandboxes", "state", "running", "node", "local"); got != 1 {
		t.Errorf("cube_sandboxes{running,local} = %v, want 1 (%s kept)", got, kept.ID)
	}
	// Never observed, yet there at 0: a build's duration and steps.
	for _, c := range []struct{ name, label, value string }{
		{"cube_template_build_duration_seconds", "outcome", "ready"},
		{"cube_template_build_step_duration_seconds", "type", "RUN"},
	} {
		if got := m.Value(c.name, c.label, c.value); got != 0 {
			t.Errorf("%s{%s=%q} = %v, want 0 (a series from the start)", c.name, c.label, c.value, got)
		}
	}
}
