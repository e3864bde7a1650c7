package template

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Builder builds a built-in template (code-interpreter-v1) in the
// background, at most one build at a time, so that a start-up need not
// wait for it and creates can: Wait waits a bounded time and then answers
// with a message saying it is still building. A failed build is tried
// again by the next Start or Wait.
type Builder struct {
	name  string
	ctx   context.Context // the builds' lifetime (the server's), not a caller's
	build func(ctx context.Context) (Template, error)
	now   func() time.Time

	mu  sync.Mutex
	cur *buildRun
}

type buildRun struct {
	done    chan struct{}
	started time.Time
	t       Template
	err     error
}

// NewBuilder returns a builder of template name that runs build under ctx.
func NewBuilder(ctx context.Context, name string, build func(ctx context.Context) (Template, error)) *Builder {
	return &Builder{name: name, ctx: ctx, build: build, now: time.Now}
}

// Name is the template the builder builds.
func (b *Builder) Name() string { return b.name }

// Start begins a build unless one runs or the last one succeeded.
func (b *Builder) Start() { b.start() }

func (b *Builder) start() *buildRun {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil {
		select {
		case <-b.cur.done:
			if b.cur.err == nil {
				return b.cur
			}
		default:
			return b.cur // still building
		}
	}
	run := &buildRun{done: make(chan struct{}), started: b.now()}
	b.cur = run
	go func() {
		defer close(run.done)
		run.t, run.err = b.build(b.ctx)
	}()
	return run
}

// Wait returns the template once built, starting a build if none runs.
// It waits at most bound (and ctx): then it fails with ErrUnavailable and
// a message saying the template is still being built; the build goes on.
func (b *Builder) Wait(ctx context.Context, bound time.Duration) (Template, error) {
	run := b.start()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case <-run.done:
		if run.err != nil {
			return Template{}, fmt.Errorf("built-in template %s could not be built (it is tried again on the next create; see the server log): %v: %w",
				b.name, run.err, errdefs.ErrUnavailable)
		}
		return run.t, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	return Template{}, fmt.Errorf("template %s is still being built (for %s; the first build on a machine takes a few minutes, later ones use the cache): try again shortly: %w",
		b.name, b.now().Sub(run.started).Round(time.Second), errdefs.ErrUnavailable)
}
