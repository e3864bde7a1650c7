package kube

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/grafanatest"
)

// The Grafana dashboard (deploy/kubernetes/dashboards/cube.json, shipped in
// the chart as dashboards/cube.json) queries only metrics Cube exports:
// every metric name in a PromQL expression is one docs/observability.md
// documents, with a suffix its type has, and one the code registers.

const (
	dashboardFile = chartDir + "/dashboards/cube.json"
	dashboardCopy = "../../deploy/kubernetes/dashboards/cube.json"
	observability = "../../docs/observability.md"
)

func loadDashboard(t *testing.T) grafanatest.Dashboard {
	t.Helper()
	d, err := grafanatest.Load(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// documentedMetrics reads the metric tables of docs/observability.md:
// rows "| `name`[, `name`] | type | ...".
func documentedMetrics(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(observability)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| (`cube_[^|]*) \\| (histogram|counter|gauge|summary) \\|")
	name := regexp.MustCompile("`(cube_[a-z0-9_]+)`")
	out := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		for _, n := range name.FindAllStringSubmatch(m[1], -1) {
			out[n[1]] = m[2]
		}
	}
	if len(out) < 20 {
		t.Fatalf("found only %d metrics in %s: did its tables change shape?", len(out), observability)
	}
	return out
}

// registeredMetrics returns the metric names in the internal/*/metrics.go
// files, where each package declares its metrics.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../../internal/*/metrics.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no internal/*/metrics.go: %v", err)
	}
	lit := regexp.MustCompile(`"(cube_[a-z0-9_]+)"`)
	out := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range lit.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
	}
	return out
}

// metricNames returns the Cube metric names an expression selects, and
// the words it uses that are neither a known function nor a Cube metric.
func metricNames(expr string) (metrics, unknown []string) {
	return grafanatest.MetricNames(expr, "cube_")
}

// resolve maps a series name to its documented metric: histograms are
// queried as _bucket, _count or _sum, everything else by its own name.
func resolve(series string, docs map[string]string) (string, bool) {
	if _, ok := docs[series]; ok {
		return series, docs[series] != "histogram"
	}
	for _, suf := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(series, suf); ok && docs[base] == "histogram" {
			return base, true
		}
	}
	return "", false
}

func TestMetricNameCheckCatchesMistakes(t *testing.T) {
	docs := map[string]string{"cube_a_seconds": "histogram", "cube_b_total": "counter", "cube_c": "gauge"}
	m, u := metricNames(`histogram_quantile(0.99, sum by (le, path) (rate(cube_a_seconds_bucket{code=~"5..", x="a{b}"}[5m]))) / on (node) group_left cube_c > 1e-9`)
	if !slices.Equal(m, []string{"cube_a_seconds_bucket", "cube_c"}) || len(u) != 0 {
		t.Fatalf("metrics %v, unknown %v", m, u)
	}
	if _, u := metricNames(`sum(rate(up[5m])) + histogram_quantil(0.5, cube_c)`); !slices.Equal(u, []string{"up", "histogram_quantil()"}) {
		t.Fatalf("unknown %v", u)
	}
	for series, ok := range map[string]bool{
		"cube_a_seconds_bucket": true, "cube_a_seconds_count": true, "cube_a_seconds": false,
		"cube_b_total": true, "cube_b_total_count": false, "cube_c": true, "cube_c_bucket": false, "cube_d": false,
	} {
		if _, got := resolve(series, docs); got != ok {
			t.Errorf("resolve(%s) = %t, want %t", series, got, ok)
		}
	}
}

func TestDashboardQueriesExistingMetrics(t *testing.T) {
	docs := documentedMetrics(t)
	code := registeredMetrics(t)
	// The docs and the code name the same metrics.
	for n := range docs {
		if !code[n] {
			t.Errorf("%s is documented in %s but not in any internal/*/metrics.go", n, observability)
		}
	}
	for n := range code {
		if _, ok := docs[n]; !ok {
			t.Errorf("%s is registered in internal/*/metrics.go but not documented in %s", n, observability)
		}
	}

	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Fatalf("dashboard uid %q title %q", d.UID, d.Title)
	}
	if len(d.Templating.List) == 0 || d.Templating.List[0].Name != "datasource" || d.Templating.List[0].Query != "prometheus" {
		t.Fatalf("first template variable %+v, want the prometheus datasource variable", d.Templating.List)
	}
	used := map[string]bool{}
	ids := map[int]string{}
	panels := d.AllPanels()
	queries := 0
	for _, p := range panels {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q query %s is empty", p.Title, q.RefID)
				continue
			}
			if strings.Count(q.Expr, "(") != strings.Count(q.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses in %s", p.Title, q.Expr)
			}
			if strings.Contains(q.Expr, "_bucket") && !strings.Contains(q.Expr, "by (le") {
				t.Errorf("panel %q: a histogram's buckets aggregated without le: %s", p.Title, q.Expr)
			}
			metrics, unknown := metricNames(q.Expr)
			if len(metrics) == 0 {
				t.Errorf("panel %q: no Cube metric in %s", p.Title, q.Expr)
			}
			if len(unknown) > 0 {
				t.Errorf("panel %q: %v in %s are neither PromQL functions nor Cube metrics", p.Title, unknown, q.Expr)
			}
			for _, s := range metrics {
				base, ok := resolve(s, docs)
				if !ok {
					t.Errorf("panel %q: %s is not a metric of %s (or not with that suffix)", p.Title, s, observability)
					continue
				}
				used[base] = true
			}
		}
	}
	// Every documented metric has a panel.
	var missing []string
	for n := range docs {
		if !used[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("no panel queries %v: add one to the dashboard", missing)
	}
	t.Logf("%d panels, %d queries over %d metrics", len(panels), queries, len(used))
}

// The copy for importing by hand is the chart's file.
func TestDashboardCopiesAreEqual(t *testing.T) {
	a, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dashboardCopy)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatalf("%s and %s differ: copy the chart's file (cp %s %s)", dashboardFile, dashboardCopy,
			strings.TrimPrefix(dashboardFile, "../../"), strings.TrimPrefix(dashboardCopy, "../../"))
	}
}
