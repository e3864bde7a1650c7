package templatebuild

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// deps is what running a build's steps needs. The Service fills it for
// the builds of the template API (log in the store, sandbox recorded,
// target checked against the store's sandboxes); Execute for builds
// without the API (the built-in templates' recipes, run on a node).
type deps struct {
	sandboxes Sandboxes
	templates Templates
	images    Images     // nil: fromImage other than base is refused
	files     *fileStore // nil: COPY steps are refused
	log       stepLog
	warn      *slog.Logger
	// recordSandbox, when set, records the build sandbox's id ("" once
	// it is gone), so a restart can kill it.
	recordSandbox func(ctx context.Context, id string) error
	// finalTarget, when set, runs right before the final commit and
	// returns the template it writes (tags.go: a tagged build may commit
	// into a per-build template); parent is the template built from.
	finalTarget func(ctx context.Context, parent string) (string, error)
	// committed, when set, runs after the final commit of template name
	// (tags.go: the build's tags then point at it).
	committed func(ctx context.Context, name string) error
	// noStepCache skips the step cache's commits (lookups still happen).
	noStepCache bool
	// metrics, when set, times the steps (the Service's builds only).
	metrics *Metrics
}

// stepLog receives a build's log entries.
type stepLog interface {
	add(level, step, msg string)
	infof(step, format string, args ...any)
}

func (s *Service) deps(buildID string) deps {
	return deps{
		sandboxes: s.cfg.Sandboxes, templates: s.cfg.Templates, images: s.cfg.Images, files: &s.files, warn: s.log,
		recordSandbox: func(ctx context.Context, id string) error {
			return s.cfg.Store.SetTemplateBuildSandbox(ctx, buildID, id)
		},
		finalTarget: func(ctx context.Context, parent string) (string, error) { return s.commitTarget(ctx, buildID, parent) },
		committed:   func(ctx context.Context, name string) error { return s.tagBuild(ctx, buildID, name) },
		metrics:     s.cfg.Metrics,
	}
}

// Target is the template a build registers and its sizes (0 = the
// parent's).
type Target struct {
	Name               string
	CPUCount, MemoryMB int
}

// Executor runs builds without the template API and its store: the same
// steps, step cache and commits as the API's builds, for recipes Cube
// itself defines (code-interpreter-v1). The caller serialises builds of
// one target.
type Executor struct {
	Sandboxes Sandboxes
	Templates Templates
	// Log, when set, gets every log entry: level (debug, info, warn,
	// error), step label ("base", "1".."n", "finalize") and message.
	Log    func(level, step, msg string)
	Logger *slog.Logger
	// CacheSteps commits each step's result to the step cache, as the
	// API's builds do; without it only the target is committed (one copy
	// of the layer instead of one per step: a recipe whose result is
	// cached whole gains nothing from caching its steps).
	CacheSteps bool
}

// LogEntry levels passed to Executor.Log.
const (
	LevelDebug = levelDebug
	LevelInfo  = levelInfo
	LevelError = levelError
)

// Execute builds target from spec: the steps run in a build sandbox of
// the parent (fromTemplate; fromImage is refused, as is COPY, which needs
// uploaded files), with CacheSteps each non-ENV step's result is cached as
// an intermediate template (a rebuild resumes from the deepest one), and
// the result is committed as target. A failure is an error naming the
// step.
func (e Executor) Execute(ctx context.Context, target Target, spec BuildSpec) error {
	from, err := ParseParent(spec)
	if err != nil {
		return err
	}
	if from.Image != "" {
		return fmt.Errorf("build %s: fromImage %s: recipes without the template API build on templates only", target.Name, from.Image)
	}
	for i, st := range spec.Steps {
		if err := st.validate(); err != nil {
			return fmt.Errorf("build %s: step %d (%s): %w", target.Name, i+1, st.Type, err)
		}
	}
	warn := e.Logger
	if warn == nil {
		warn = slog.Default()
	}
	r := &runner{deps: deps{sandboxes: e.Sandboxes, templates: e.Templates, log: funcLog(e.Log), warn: warn, noStepCache: !e.CacheSteps},
		target: target, from: from, parent: from.Template, spec: spec}
	start := time.Now()
	if err := r.build(ctx); err != nil {
		r.log.add(levelError, stepOf(err), "build failed: "+err.Error())
		return fmt.Errorf("build %s: %w", target.Name, err)
	}
	r.log.infof(stepFinalize, "build finished in %s", time.Since(start).Round(time.Millisecond))
	return nil
}

func stepOf(err error) string {
	if se, ok := err.(*stepError); ok {
		return se.step
	}
	return stepBase
}

// funcLog is a stepLog over a function (nil discards).
type funcLog func(level, step, msg string)

func (f funcLog) add(level, step, msg string) {
	if f != nil {
		f(level, step, msg)
	}
}

func (f funcLog) infof(step, format string, args ...any) {
	f.add(levelInfo, step, fmt.Sprintf(format, args...))
}
