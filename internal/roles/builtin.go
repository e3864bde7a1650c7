package roles

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
)

// builtinWait bounds how long a create of a built-in template that is
// still being built waits before it is answered 503 "still being built".
// It stays under the E2B SDK's default request timeout (60 s).
const builtinWait = 45 * time.Second

// builtinSource is the server's template source plus the built-in
// templates that are built on demand (code-interpreter-v1): a create that
// names one the registry lacks starts or joins its build and waits a
// bounded time.
type builtinSource struct {
	cluster.TemplateSource
	builders map[string]*template.Builder
	wait     time.Duration
}

var _ cluster.TemplateSource = builtinSource{}

// newBuiltinSource returns the source of an all-in-one server: its
// registry, with code-interpreter-v1 built under ctx in the background now
// when prebuild is set, else on its first create. The build's notes go to
// log; out gets one line when it starts and one when it ends.
func newBuiltinSource(ctx context.Context, templates *template.Registry, prebuild bool, out io.Writer, log *slog.Logger) builtinSource {
	if out == nil {
		out = io.Discard
	}
	b := template.NewBuilder(ctx, template.InterpName, func(ctx context.Context) (template.Template, error) {
		if _, err := templates.Get(ctx, template.InterpName); err == nil {
			return templates.EnsureInterp(ctx, nil)
		}
		start := time.Now()
		fmt.Fprintf(out, "cube: building template %s in the background (first time only: a few minutes; cached afterwards)\n", template.InterpName)
		progress := logWriter(log.With("template", template.InterpName))
		defer progress.Close()
		t, err := templates.EnsureInterp(ctx, progress)
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(out, "cube: template %s: build failed: %v\n", template.InterpName, err)
			}
			return t, err
		}
		fmt.Fprintf(out, "cube: template %s ready (%s)\n", template.InterpName, time.Since(start).Round(time.Second))
		return t, nil
	})
	if prebuild {
		b.Start()
	}
	return builtinSource{TemplateSource: templatedist.Source{Registry: templates},
		builders: map[string]*template.Builder{b.Name(): b}, wait: builtinWait}
}

func (s builtinSource) ServerTemplate(ctx context.Context, name string) (cluster.TemplateRef, error) {
	ref, err := s.TemplateSource.ServerTemplate(ctx, name)
	b, ok := s.builders[name]
	if !ok || !errors.Is(err, errdefs.ErrNotFound) {
		return ref, err
	}
	if _, err := b.Wait(ctx, s.wait); err != nil {
		return cluster.TemplateRef{}, err
	}
	return s.TemplateSource.ServerTemplate(ctx, name)
}

// logWriter logs each line written to it at debug level (debootstrap's
// progress would drown the server's output otherwise).
func logWriter(log *slog.Logger) io.WriteCloser {
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			log.Debug("template build", "line", sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return pw
}

// builtinFetcher is a node's template fetcher that builds the built-in
// code-interpreter-v1 on the node, as the node builds base, instead of
// streaming its ~650 MB from the server: with the shared debootstrap cache
// that takes seconds. A build outlives the create that started it (the
// builder runs under the node's ctx); creates wait for it a bounded time.
type builtinFetcher struct {
	cubelet.TemplateFetcher
	interp *template.Builder
}

var _ cubelet.TemplateFetcher = builtinFetcher{}

// nodeFetcher returns fetch, wrapped to build built-in templates on the
// node when it builds its own base (build).
func nodeFetcher(ctx context.Context, build bool, templates *template.Registry, fetch cubelet.TemplateFetcher) cubelet.TemplateFetcher {
	if !build {
		return fetch
	}
	return builtinFetcher{TemplateFetcher: fetch, interp: template.NewBuilder(ctx, template.InterpName,
		func(ctx context.Context) (template.Template, error) { return templates.EnsureInterp(ctx, nil) })}
}

func (f builtinFetcher) Fetch(ctx context.Context, reg *template.Registry, name string) (template.Template, error) {
	if name == f.interp.Name() {
		return f.interp.Wait(ctx, builtinWait)
	}
	return f.TemplateFetcher.Fetch(ctx, reg, name)
}
