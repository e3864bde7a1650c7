package promtest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// recorder keeps the errors a check reports instead of failing the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Errorf(f string, args ...any) { r.errs = append(r.errs, fmt.Sprintf(f, args...)) }

func TestScrapeRefusesSandboxIDLabelsAndLintProblems(t *testing.T) {
	for _, c := range []struct {
		name, page string
		want       []string
	}{
		{"clean", "# HELP cube_x_total Things.\n# TYPE cube_x_total counter\ncube_x_total{template=\"base\"} 1\n", nil},
		{"sandbox id label", "# HELP cube_x_total Things.\n# TYPE cube_x_total counter\ncube_x_total{sandbox_id=\"abc\"} 1\n",
			[]string{`cube_x_total has label "sandbox_id"`}},
		{"counter without _total", "# HELP cube_x Things.\n# TYPE cube_x counter\ncube_x 1\n", []string{"promlint"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprint(w, c.page)
			}))
			defer srv.Close()
			r := &recorder{TB: t}
			Scrape(r, srv.Client(), srv.URL)
			if len(r.errs) != len(c.want) {
				t.Fatalf("errors %q, want %d like %q", r.errs, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(r.errs[i], w) {
					t.Errorf("error %q does not mention %q", r.errs[i], w)
				}
			}
		})
	}
}
