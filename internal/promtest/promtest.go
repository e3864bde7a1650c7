// Package promtest reads Prometheus metrics in tests: a registry's families
// or a scraped /metrics page, looked up by name and label pairs.
package promtest

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families are metric families by name.
type Families map[string]*dto.MetricFamily

// Gather gathers g and fails t on an error; promlint problems are errors
// of t.
func Gather(t testing.TB, g prometheus.Gatherer) Families {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if probs, err := promlint.NewWithMetricFamilies(fams).Lint(); err != nil || len(probs) > 0 {
		t.Errorf("promlint: %v %v", probs, err)
	}
	out := Families{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	checkLabels(t, out)
	return out
}

// unboundedLabels are label names that would carry a sandbox id: one
// series per sandbox ever made. Per-sandbox numbers are on the E2B metrics
// endpoint instead.
var unboundedLabels = map[string]bool{"sandbox": true, "sandbox_id": true, "sandboxid": true, "id": true}

// checkLabels fails t for a series with a label that would carry a sandbox
// id.
func checkLabels(t testing.TB, fams Families) {
	t.Helper()
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if unboundedLabels[strings.ToLower(lp.GetName())] {
					t.Errorf("%s has label %q: a sandbox id makes a series per sandbox", name, lp.GetName())
				}
			}
		}
	}
}

// Scrape GETs url (a /metrics page) with hc (nil: http.DefaultClient),
// parses it with the Prometheus text parser and lints it (promlint, and no
// label that would carry a sandbox id): problems are errors of t.
func Scrape(t testing.TB, hc *http.Client, url string) Families {
	t.Helper()
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse %s: %v\n%s", url, err, b)
	}
	if probs, err := promlint.New(bytes.NewReader(b)).Lint(); err != nil || len(probs) > 0 {
		t.Errorf("promlint %s: %v %v", url, probs, err)
	}
	checkLabels(t, fams)
	return fams
}

// Find returns the series of family name whose labels include the given
// name/value pairs, or nil.
func (f Families) Find(name string, labels ...string) *dto.Metric {
	for _, m := range f[name].GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && got[labels[i]] == labels[i+1]
		}
		if ok {
			return m
		}
	}
	return nil
}

// Value is the series' counter or gauge value, or its histogram's sample
// count; -1 when there is no such series.
func (f Families) Value(name string, labels ...string) float64 {
	m := f.Find(name, labels...)
	switch {
	case m == nil:
		return -1
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	default:
		return m.GetGauge().GetValue()
	}
}

// Missing returns the series names (as a query names them: a histogram's
// _bucket, _sum or _count, a summary's _sum or _count) that have no
// sample in any of the scrapes, in the order given.
func Missing(series []string, scrapes ...Families) []string {
	var out []string
	for _, s := range series {
		found := false
		for _, f := range scrapes {
			found = found || f.has(s)
		}
		if !found {
			out = append(out, s)
		}
	}
	return out
}

// has reports whether series has a sample in f.
func (f Families) has(series string) bool {
	switch fam := f[series]; fam.GetType() {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM, dto.MetricType_SUMMARY:
		// Selected by its suffixed series only.
	default:
		if len(fam.GetMetric()) > 0 {
			return true
		}
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suf)
		if !ok || len(f[base].GetMetric()) == 0 {
			continue
		}
		switch f[base].GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			return true
		case dto.MetricType_SUMMARY:
			return suf != "_bucket"
		}
	}
	return false
}
