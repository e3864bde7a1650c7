package templatebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/promtest"
	"github.com/cube-dev/cube/internal/template"
)

// withMetrics gives the fixture's service metrics on a fresh registry
// (before any build starts, so no build reads the field meanwhile).
func withMetrics(t *testing.T, f *fixture) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	f.svc.cfg.Metrics = m
	return reg
}

// Builds that fail, uploads accepted and refused, and a build the server's
// stop interrupts move the counters with their outcome.
func TestBuildMetricsOutcomes(t *testing.T) {
	f := newFixture(t, nil)
	reg := withMetrics(t, f)
	ctx := context.Background()
	f0 := promtest.Gather(t, reg)
	for _, o := range []string{OutcomeReady, OutcomeError, OutcomeInterrupted} {
		if got := f0.Value("cube_template_builds_finished_total", "outcome", o); got != 0 {
			t.Errorf("finished{%s} before any build = %v, want 0", o, got)
		}
	}

	// An upload through a valid URL counts its bytes; a body that is no
	// tar archive is an error and adds none.
	hash := strings.Repeat("b", 64)
	body := makeTar(t, true, entry{name: "f.txt", typ: tar.TypeReg, body: strings.Repeat("x", 5000)})
	exp := time.Now().Add(time.Hour).Unix()
	expires := strconv.FormatInt(exp, 10)
	if err := f.svc.PutFile(ctx, hash, uploadToken(f.svc.cfg.Secret, hash, exp), expires, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	bad := strings.Repeat("c", 64)
	if err := f.svc.PutFile(ctx, bad, uploadToken(f.svc.cfg.Secret, bad, exp), expires, strings.NewReader("not a tar")); err == nil {
		t.Fatal("a non-tar upload was accepted")
	}

	// The build sandbox cannot start: the build ends as an error.
	req, err := f.svc.RequestBuild(ctx, BuildRequest{Name: "broken"})
	if err != nil {
		t.Fatal(err)
	}
	f.sb.createErr = fmt.Errorf("no node: %w", errdefs.ErrUnavailable)
	if err := f.svc.StartBuild(ctx, req.TemplateID, req.BuildID, BuildSpec{FromTemplate: "base"}); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.wait(t, req.TemplateID, req.BuildID); info.Status != "error" {
		t.Fatalf("build %+v", info)
	}
	f.sb.createErr = nil

	// A step hangs in envd until the service stops: interrupted.
	// (The body is read first: only then does the server notice the
	// client going away and end the request's context.)
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	defer hang.Close()
	f.sb.envdURL = hang.URL
	req, err = f.svc.RequestBuild(ctx, BuildRequest{Name: "stopped"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.StartBuild(ctx, req.TemplateID, req.BuildID, BuildSpec{FromTemplate: "base",
		Steps: []Step{{Type: StepRun, Args: []string{"sleep 1000"}}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		created, _, _ := f.sb.snapshot()
		if len(created) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second build never started its sandbox")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // into the step
	f.svc.Close()

	got := promtest.Gather(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"cube_template_builds_started_total", nil, 2},
		{"cube_template_builds_finished_total", []string{"outcome", OutcomeError}, 1},
		{"cube_template_builds_finished_total", []string{"outcome", OutcomeInterrupted}, 1},
		{"cube_template_builds_finished_total", []string{"outcome", OutcomeReady}, 0},
		{"cube_template_build_duration_seconds", []string{"outcome", OutcomeError}, 1},
		{"cube_template_build_duration_seconds", []string{"outcome", OutcomeInterrupted}, 1},
		{"cube_template_build_uploads_total", []string{"outcome", "ok"}, 1},
		{"cube_template_build_uploads_total", []string{"outcome", "error"}, 1},
		{"cube_template_build_upload_bytes_total", nil, float64(len(body))},
	} {
		if v := got.Value(c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	// No step succeeded: the step series are there from the start, at 0.
	steps := got["cube_template_build_step_duration_seconds"].GetMetric()
	if len(steps) != 10 {
		t.Errorf("%d step series, want 10 (5 types, cached or not) from the start", len(steps))
	}
	for _, m := range steps {
		if m.GetHistogram().GetSampleCount() != 0 {
			t.Errorf("a step counted after builds whose steps never succeeded: %v", m)
		}
	}
}

// A build's steps are timed by type through a real envd; a rebuild takes
// them from the step cache and counts them as cached.
func TestBuildStepMetrics(t *testing.T) {
	url, token := startEnvd(t)
	work := t.TempDir()
	f := newFixture(t, &template.Defaults{User: "root", Workdir: work})
	f.sb.envdURL, f.sb.envdToken = url, token
	reg := withMetrics(t, f)
	steps := []Step{
		{Type: StepWorkdir, Args: []string{"sub"}},
		{Type: StepRun, Args: []string{"sleep 0.2; echo hi > a.txt"}},
		{Type: StepEnv, Args: []string{"A", "1"}},
		{Type: StepRun, Args: []string{"cat a.txt"}},
	}
	for range 2 {
		if info, logs := f.build(t, BuildSpec{FromTemplate: "base", Steps: steps}); info.Status != "ready" {
			t.Fatalf("build %+v\n%s", info, messages(logs))
		}
	}
	got := promtest.Gather(t, reg)
	const m = "cube_template_build_step_duration_seconds"
	for _, c := range []struct {
		typ, cached string
		want        float64
	}{
		{StepRun, "false", 2}, {StepWorkdir, "false", 1}, {StepEnv, "false", 1},
		// The rebuild resumes from the deepest cached step (the last RUN).
		{StepRun, "true", 2}, {StepWorkdir, "true", 1}, {StepEnv, "true", 1},
	} {
		if v := got.Value(m, "type", c.typ, "cached", c.cached); v != c.want {
			t.Errorf("%s{type=%s,cached=%s} = %v, want %v", m, c.typ, c.cached, v, c.want)
		}
	}
	if s := got.Find(m, "type", StepRun, "cached", "false").GetHistogram().GetSampleSum(); s < 0.2 {
		t.Errorf("RUN steps took %vs in all, want >= 0.2 (one sleeps 0.2s)", s)
	}
	if s := got.Find(m, "type", StepRun, "cached", "true").GetHistogram().GetSampleSum(); s != 0 {
		t.Errorf("cached RUN steps took %vs, want 0", s)
	}
	if v := got.Value("cube_template_builds_finished_total", "outcome", OutcomeReady); v != 2 {
		t.Errorf("ready builds %v, want 2", v)
	}
}
