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
	"github.com/cube-dev/cube/internal/templatebuild"
	"github.com/cube-dev/cube/internal/templatedist"
)

// builtinWait bounds how long a create of a built-in template that is
// still being built waits before it is answered 503 "still being built".
// It stays under the E2B SDK's default request timeout (60 s).
const builtinWait = 45 * time.Second

// builtinSource is the server's template source plus the built-in
// templates Cube builds from recipes (code-interpreter-v1). All-in-one
// builds them on its node: a create that names one the registry lacks
// starts or joins its build and waits a bounded time. A cluster server
// has no node of its own (builders empty): the nodes build them (see
// builtinFetcher), and until the server's registry holds one it is
// answered with the registry's default sizes.
type builtinSource struct {
	cluster.TemplateSource
	builders map[string]*template.Builder
	wait     time.Duration
}

var _ cluster.TemplateSource = builtinSource{}

// newBuiltinSource returns the source of a server: its registry, with
// code-interpreter-v1 built on node (nil: by the nodes) from its recipe,
// under ctx, in the background now when prebuild is set, else on its
// first create. The build's notes go to log; out gets one line when it
// starts and one when it ends.
func newBuiltinSource(ctx context.Context, templates *template.Registry, node *nodeSandboxes, prebuild bool, out io.Writer, log *slog.Logger) builtinSource {
	s := builtinSource{TemplateSource: templatedist.Source{Registry: templates}, builders: map[string]*template.Builder{}, wait: builtinWait}
	if node == nil {
		return s
	}
	if out == nil {
		out = io.Discard
	}
	rb := recipeBuilder{recipe: templatebuild.InterpRecipe(), templates: templates, sandboxes: node, log: log}
	b := template.NewBuilder(ctx, rb.recipe.Name, func(ctx context.Context) (template.Template, error) {
		if t, err := templates.Get(ctx, rb.recipe.Name); err == nil && rb.recipe.Built(t) {
			return t, nil
		}
		start := time.Now()
		fmt.Fprintf(out, "cube: building template %s in the background (first time only: a few minutes; cached afterwards)\n", rb.recipe.Name)
		progress := logWriter(log.With("template", rb.recipe.Name))
		defer progress.Close()
		t, err := rb.ensure(ctx, progress)
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(out, "cube: template %s: build failed: %v\n", rb.recipe.Name, err)
			}
			return t, err
		}
		fmt.Fprintf(out, "cube: template %s ready (%s)\n", rb.recipe.Name, time.Since(start).Round(time.Second))
		return t, nil
	})
	if prebuild {
		b.Start()
	}
	s.builders[b.Name()] = b
	return s
}

func (s builtinSource) ServerTemplate(ctx context.Context, name string) (cluster.TemplateRef, error) {
	ref, err := s.TemplateSource.ServerTemplate(ctx, name)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return ref, err
	}
	b, ok := s.builders[name]
	if !ok {
		if name == template.InterpName {
			// Built by the node a create lands on (builtinFetcher).
			return cluster.TemplateRef{Name: name, CPUCount: template.DefaultCPUCount, MemoryMB: template.DefaultMemoryMB,
				DiskSizeMB: template.DefaultDiskSizeMB}, nil
		}
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
// code-interpreter-v1 on the node from its recipe (a build sandbox of
// base, then a commit), instead of streaming its ~650 MB from the server;
// with the result cache that takes seconds. A build outlives the create
// that started it (the builder runs under the node's ctx); creates wait
// for it a bounded time.
type builtinFetcher struct {
	cubelet.TemplateFetcher
	interp *template.Builder
}

var _ cubelet.TemplateFetcher = builtinFetcher{}

// nodeFetcher returns fetch, wrapped to build the built-in templates on
// the node through sandboxes.
func nodeFetcher(ctx context.Context, templates *template.Registry, fetch cubelet.TemplateFetcher, sandboxes *nodeSandboxes, log *slog.Logger) builtinFetcher {
	rb := recipeBuilder{recipe: templatebuild.InterpRecipe(), templates: templates, sandboxes: sandboxes, log: log}
	return builtinFetcher{TemplateFetcher: fetch, interp: template.NewBuilder(ctx, rb.recipe.Name,
		func(ctx context.Context) (template.Template, error) {
			progress := logWriter(log.With("template", rb.recipe.Name))
			defer progress.Close()
			return rb.ensure(ctx, progress)
		})}
}

func (f builtinFetcher) Fetch(ctx context.Context, reg *template.Registry, name string) (template.Template, error) {
	if name == f.interp.Name() {
		return f.interp.Wait(ctx, builtinWait)
	}
	return f.TemplateFetcher.Fetch(ctx, reg, name)
}

// rebuildStale starts the build of a built-in template an older recipe
// made (a node fetches only what it lacks, so it would keep it forever).
func (f builtinFetcher) rebuildStale(ctx context.Context, templates *template.Registry) {
	if t, err := templates.Get(ctx, f.interp.Name()); err == nil && !templatebuild.InterpRecipe().Built(t) {
		f.interp.Start()
	}
}
