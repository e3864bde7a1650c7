package templatebuild

import (
	"context"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the template API's build numbers (docs/observability.md):
// builds started and finished by outcome, their durations, each step's
// duration by type and whether the step cache had it, and uploaded COPY
// archives. Builds of the built-in recipes (Executor, on a node) are not
// counted. Labels are bounded: an outcome, a step type, cached or not.
// Methods are safe on a nil *Metrics (Config.Metrics unset).
type Metrics struct {
	started     prometheus.Counter
	finished    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	steps       *prometheus.HistogramVec
	uploadBytes prometheus.Counter
	uploads     *prometheus.CounterVec
}

// Build outcomes: ready, error (a step, the base or the commit failed, or
// the build timed out), interrupted (the server stopped during the build).
const (
	OutcomeReady       = "ready"
	OutcomeError       = "error"
	OutcomeInterrupted = "interrupted"
)

// NewMetrics makes the build metrics and registers them with reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		started: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cube_template_builds_started_total",
			Help: "Template builds started through the template API (POST .../builds/{id}).",
		}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cube_template_builds_finished_total",
			Help: "Template builds that ended, by outcome (ready, error, interrupted: the server stopped during the build).",
		}, []string{"outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cube_template_build_duration_seconds",
			Help:    "Duration of template builds, from their start (waiting for a build slot included) to their end, by outcome.",
			Buckets: []float64{1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"outcome"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cube_template_build_step_duration_seconds",
			Help: "Duration of template build steps that succeeded, by type (RUN, COPY, ENV, WORKDIR, USER) and cached " +
				"(true: taken from the step cache, observed as 0; false: run in the build sandbox).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
		}, []string{"type", "cached"}),
		uploadBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cube_template_build_upload_bytes_total",
			Help: "Bytes of COPY archives received through upload URLs, of uploads that were accepted.",
		}),
		uploads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cube_template_build_uploads_total",
			Help: "Uploads of COPY archives through upload URLs with a valid token, by outcome (ok; error: too large, not a tar archive, or not stored).",
		}, []string{"outcome"}),
	}
	// Every outcome and step type exists from the start, so rates are
	// defined (and dashboards show 0, not "no data") before the first
	// build ends.
	for _, o := range []string{OutcomeReady, OutcomeError, OutcomeInterrupted} {
		m.finished.WithLabelValues(o)
		m.duration.WithLabelValues(o)
	}
	for _, typ := range []string{StepRun, StepCopy, StepEnv, StepWorkdir, StepUser} {
		m.steps.WithLabelValues(typ, "false")
		m.steps.WithLabelValues(typ, "true")
	}
	m.uploads.WithLabelValues("ok")
	m.uploads.WithLabelValues("error")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.started, m.finished, m.duration, m.steps, m.uploadBytes, m.uploads} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (m *Metrics) buildStarted() {
	if m != nil {
		m.started.Inc()
	}
}

// buildFinished records a build that ended with err (nil: ready); stopped
// is the service's context, done when the server stops.
func (m *Metrics) buildFinished(err error, stopped context.Context, d time.Duration) {
	if m == nil {
		return
	}
	outcome := OutcomeReady
	switch {
	case err == nil:
	case stopped.Err() != nil:
		outcome = OutcomeInterrupted
	default:
		outcome = OutcomeError
	}
	m.finished.WithLabelValues(outcome).Inc()
	m.duration.WithLabelValues(outcome).Observe(d.Seconds())
}

// stepDone records a step that succeeded (run for d) or came from the
// step cache.
func (m *Metrics) stepDone(typ string, cached bool, d time.Duration) {
	if m == nil {
		return
	}
	c := "false"
	if cached {
		c, d = "true", 0
	}
	m.steps.WithLabelValues(stepTypeLabel(typ), c).Observe(d.Seconds())
}

// stepTypeLabel bounds the type label to the step types this package runs.
func stepTypeLabel(typ string) string {
	switch typ {
	case StepRun, StepCopy, StepEnv, StepWorkdir, StepUser:
		return typ
	}
	return "other"
}

// upload counts an upload's body as it is read; done records it.
func (m *Metrics) upload(body io.Reader) (io.Reader, func(err error)) {
	if m == nil {
		return body, func(error) {}
	}
	c := &countingReader{r: body}
	return c, func(err error) {
		if err != nil {
			m.uploads.WithLabelValues("error").Inc()
			return
		}
		m.uploads.WithLabelValues("ok").Inc()
		m.uploadBytes.Add(float64(c.n))
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
