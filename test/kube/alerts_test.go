package kube

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Cube's alerting rules (deploy/kubernetes/chart/alerts/cube-rules.yaml):
// docs/operations.md explains each, the chart renders them as a
// PrometheusRule where the Prometheus Operator's API exists.

const (
	rulesFile  = chartDir + "/alerts/cube-rules.yaml"
	operations = "../../docs/operations.md"
)

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T) (ruleFile, []byte) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return f, b
}

// TestAlertRulesQueryExistingMetrics: every rule queries only metrics Cube
// exports (documented, with a suffix their type has), says how long and
// how bad, and docs/operations.md has a section for it with its exact
// expression.
func TestAlertRulesQueryExistingMetrics(t *testing.T) {
	docs := documentedMetrics(t)
	f, _ := loadRules(t)
	page, err := os.ReadFile(operations)
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range f.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %+v: no name or no rules", g)
		}
		for _, r := range g.Rules {
			alerts++
			if r.Alert == "" || r.For == "" {
				t.Errorf("rule %q: alert name and for are required (for: %q)", r.Alert, r.For)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("rule %s: severity %q, want warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("rule %s: summary and description annotations are required", r.Alert)
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
				t.Errorf("rule %s: unbalanced parentheses in %s", r.Alert, r.Expr)
			}
			metrics, unknown := metricNames(r.Expr)
			if len(metrics) == 0 || len(unknown) > 0 {
				t.Errorf("rule %s: Cube metrics %v, words that are neither PromQL nor Cube metrics %v in %s", r.Alert, metrics, unknown, r.Expr)
			}
			for _, s := range metrics {
				if _, ok := resolve(s, docs); !ok {
					t.Errorf("rule %s: %s is not a metric of %s (or not with that suffix)", r.Alert, s, observability)
				}
			}
			if !strings.Contains(string(page), "### "+r.Alert+"\n") {
				t.Errorf("%s has no section \"### %s\"", operations, r.Alert)
			}
			if !strings.Contains(string(page), "\n"+r.Expr+"\n") {
				t.Errorf("%s does not show rule %s's expression as it is in the rules file:\n%s", operations, r.Alert, r.Expr)
			}
		}
	}
	if alerts < 3 {
		t.Fatalf("%d alerts in %s, want the three of docs/operations.md at least", alerts, rulesFile)
	}
}

// TestPrometheusRuleRendersTheRulesFile: with metrics.prometheusRule and
// the Operator's API, the chart renders the rules file unchanged as the
// PrometheusRule cube; without the API, or with metrics off, nothing.
func TestPrometheusRuleRendersTheRulesFile(t *testing.T) {
	_, raw := loadRules(t)
	var want map[string]any
	if err := yaml.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	vals := "metrics: {prometheusRule: {enabled: true, labels: {release: kps}}}"
	pr := get(t, renderAPIs(t, vals, monitoringAPI), "PrometheusRule", "cube")
	if dig(pr.Doc, "apiVersion") != monitoringAPI || dig(pr.Doc, "metadata", "namespace") != "cube-system" ||
		dig(pr.Doc, "metadata", "labels", "release") != "kps" {
		t.Errorf("PrometheusRule: apiVersion %v, metadata %v", pr.Doc["apiVersion"], pr.Doc["metadata"])
	}
	if got := dig(pr.Doc, "spec"); !reflect.DeepEqual(got, want) {
		t.Errorf("PrometheusRule spec is not %s:\n%v", rulesFile, got)
	}
	for name, objs := range map[string][]Object{
		"no monitoring API": render(t, vals),
		"metrics off":       renderAPIs(t, "metrics: {enabled: false, prometheusRule: {enabled: true}}", monitoringAPI),
		"not enabled":       renderAPIs(t, "", monitoringAPI),
	} {
		for _, o := range objs {
			if o.Kind() == "PrometheusRule" {
				t.Errorf("%s: PrometheusRule %s rendered", name, o.Name())
			}
		}
	}
}
