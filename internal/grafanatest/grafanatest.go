// Package grafanatest reads a Grafana dashboard's JSON in tests: its
// panels, their PromQL queries and the metric names those queries select.
// test/kube checks the names against the docs and the code; the live tests
// (test/integration, test/cluster) check them against a scrape.
package grafanatest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Dashboard is the part of a dashboard's JSON model the tests read.
type Dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct{ Name, Type, Query string }
	}
	Panels []Panel `json:"panels"`
}

// Panel is one panel, or a row holding collapsed panels.
type Panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type, UID string
	} `json:"datasource"`
	Targets []struct {
		Expr         string `json:"expr"`
		RefID        string `json:"refId"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []Panel `json:"panels"` // of a collapsed row
}

// Load reads the dashboard JSON at path.
func Load(path string) (Dashboard, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Dashboard{}, err
	}
	var d Dashboard
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&d); err != nil {
		return Dashboard{}, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// AllPanels returns the top-level panels followed, each, by the panels of
// its collapsed row.
func (d Dashboard) AllPanels() []Panel {
	var out []Panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// Series returns the sorted, distinct series names (prefix ones, as
// MetricNames finds them) the dashboard's queries select.
func (d Dashboard) Series(prefix string) []string {
	var out []string
	for _, p := range d.AllPanels() {
		for _, q := range p.Targets {
			m, _ := MetricNames(q.Expr, prefix)
			out = append(out, m...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promToken    = regexp.MustCompile(`[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?|[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// Functions, aggregations and keywords an expression may name.
	promWords = map[string]bool{
		"sum": true, "min": true, "max": true, "avg": true, "count": true, "topk": true, "bottomk": true,
		"rate": true, "irate": true, "increase": true, "delta": true, "deriv": true, "histogram_quantile": true,
		"clamp_min": true, "clamp_max": true, "scalar": true, "vector": true, "abs": true, "time": true,
		"max_over_time": true, "min_over_time": true, "avg_over_time": true, "label_replace": true,
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "group_left": true, "group_right": true,
	}
)

// MetricNames returns the series names starting with prefix that a PromQL
// expression selects, and the words it uses that are neither a known
// function nor such a name (a typo, or another exporter's metric).
func MetricNames(expr, prefix string) (metrics, unknown []string) {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, "")
	e = promRange.ReplaceAllString(e, "")
	e = promGrouping.ReplaceAllString(e, "")
	for _, loc := range promToken.FindAllStringIndex(e, -1) {
		w := e[loc[0]:loc[1]]
		switch {
		case w[0] >= '0' && w[0] <= '9':
		case promWords[w]:
		case strings.HasPrefix(strings.TrimSpace(e[loc[1]:]), "("):
			unknown = append(unknown, w+"()")
		case strings.HasPrefix(w, prefix):
			metrics = append(metrics, w)
		default:
			unknown = append(unknown, w)
		}
	}
	return metrics, unknown
}
