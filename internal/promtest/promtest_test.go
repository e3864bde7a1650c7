package promtest

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestMissing(t *testing.T) {
	page := `# TYPE a_seconds histogram
a_seconds_bucket{le="+Inf"} 1
a_seconds_sum 0.5
a_seconds_count 1
# TYPE b_total counter
b_total{x="1"} 0
# TYPE c summary
c_sum 1
c_count 1
# TYPE d_total counter
`
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	other := Families{"e": fams["b_total"]}
	got := Missing([]string{"a_seconds_bucket", "a_seconds_sum", "a_seconds", "b_total", "b_total_count",
		"c_sum", "c_bucket", "d_total", "e", "f"}, fams, other)
	// a_seconds is a histogram queried without a suffix; d_total was
	// declared but has no series; e is in the second scrape.
	if want := []string{"a_seconds", "b_total_count", "c_bucket", "d_total", "f"}; !slices.Equal(got, want) {
		t.Fatalf("Missing = %v, want %v", got, want)
	}
}
