// Package interp is the code-interpreter server of Cube sandboxes: it
// speaks the HTTP API of E2B's code interpreter (port 49999; POST /execute
// streaming newline-delimited JSON, /contexts) that the
// `@e2b/code-interpreter` client uses, and runs the code in Jupyter kernels
// it starts itself and talks to over ZeroMQ with the Jupyter messaging
// protocol. One kernel per context; a default context per language.
package interp

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/errdefs"
)

// Port is where the code-interpreter client expects the server.
const Port = 49999

// Config configures an Interp.
type Config struct {
	// KernelDirs are searched for kernelspecs (DefaultKernelDirs if nil).
	KernelDirs []string
	// User runs the kernels (a name in PasswdFile); empty: this process's
	// user. A user that does not exist is an error at start.
	User       string
	PasswdFile string // /etc/passwd if empty
	GroupFile  string // /etc/group if empty
	// Cwd is the working directory of contexts that name none (the user's
	// home if empty).
	Cwd string
	// RunDir holds the kernels' connection files (os.TempDir() if empty).
	RunDir string
	// EnvdURL is envd's base URL. envd decides the access token (auth.go)
	// and holds the sandbox's env vars (GET /envs); empty: no envd, so no
	// token is checked and no sandbox env vars are read.
	EnvdURL string
	Log     *slog.Logger
}

// Interp holds the contexts of one sandbox.
type Interp struct {
	cfg     Config
	log     *slog.Logger
	kernels Kernels
	cred    *syscall.Credential
	env     []string // the kernels' base environment
	client  *http.Client

	mu       sync.Mutex
	contexts map[string]*Context
	defaults map[string]*Context // language -> its default context
}

// New reads the kernelspecs and resolves the kernels' user. Kernels start
// later: Prewarm, or the first execution.
func New(cfg Config) (*Interp, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.KernelDirs == nil {
		cfg.KernelDirs = DefaultKernelDirs
	}
	if cfg.RunDir == "" {
		cfg.RunDir = os.TempDir()
	}
	kernels, err := FindKernels(cfg.KernelDirs)
	if err != nil {
		return nil, err
	}
	it := &Interp{cfg: cfg, log: cfg.Log, kernels: kernels, client: &http.Client{Timeout: 5 * time.Second},
		contexts: map[string]*Context{}, defaults: map[string]*Context{}}
	home := "/"
	if h, err := os.UserHomeDir(); err == nil {
		home = h
	}
	it.env = append([]string(nil), os.Environ()...)
	if cfg.User != "" {
		u, err := account.NewSettings(cfg.PasswdFile, cfg.GroupFile).Lookup(cfg.User)
		if err != nil {
			return nil, fmt.Errorf("kernel user: %w", err)
		}
		home = u.Home
		it.cred = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
		it.env = append(it.env, "USER="+u.Name, "LOGNAME="+u.Name, "HOME="+u.Home, "SHELL="+u.Shell)
	}
	if it.cfg.Cwd == "" {
		it.cfg.Cwd = home
	}
	it.env = append(it.env, "LANG=C.UTF-8", "PYTHONUNBUFFERED=1")
	return it, nil
}

// Languages are the languages this sandbox has kernels for.
func (it *Interp) Languages() []string { return it.kernels.Languages() }

func (it *Interp) kernelOpts(cwd string) kernelOpts {
	return kernelOpts{Cwd: cwd, Env: it.env, Credential: it.cred, RunDir: it.cfg.RunDir, Log: it.log}
}

// Prewarm creates the default Python context and starts its kernel, so
// the first execution does not wait for it.
func (it *Interp) Prewarm(ctx context.Context) error {
	c, err := it.defaultContext("python")
	if err != nil {
		return err
	}
	c.run.Lock()
	defer c.run.Unlock()
	_, err = c.kernel(ctx)
	return err
}

// defaultContext returns language's default context, creating it (without
// starting its kernel) on first use.
func (it *Interp) defaultContext(language string) (*Context, error) {
	spec, err := it.kernels.Lookup(language)
	if err != nil {
		return nil, err
	}
	lang := NormalizeLanguage(language)
	it.mu.Lock()
	defer it.mu.Unlock()
	if c, ok := it.defaults[lang]; ok {
		return c, nil
	}
	c := it.newContextLocked(spec, lang, it.cfg.Cwd)
	it.defaults[lang] = c
	return c, nil
}

func (it *Interp) newContextLocked(spec KernelSpec, lang, cwd string) *Context {
	c := &Context{ID: newID(), Language: lang, Cwd: cwd, spec: spec, it: it}
	it.contexts[c.ID] = c
	return c
}

// CreateContext creates a context and starts its kernel.
func (it *Interp) CreateContext(ctx context.Context, language, cwd string) (*Context, error) {
	spec, err := it.kernels.Lookup(language)
	if err != nil {
		return nil, err
	}
	if cwd == "" {
		cwd = it.cfg.Cwd
	}
	if err := checkCwd(cwd); err != nil {
		return nil, err
	}
	it.mu.Lock()
	c := it.newContextLocked(spec, NormalizeLanguage(language), cwd)
	it.mu.Unlock()
	c.run.Lock()
	defer c.run.Unlock()
	if _, err := c.kernel(ctx); err != nil {
		it.RemoveContext(c.ID)
		return nil, err
	}
	return c, nil
}

// Context returns the context with id.
func (it *Interp) Context(id string) (*Context, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	if c, ok := it.contexts[id]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("context %q not found (list them with GET /contexts): %w", id, errdefs.ErrNotFound)
}

// Contexts lists the contexts, oldest default first, then by id.
func (it *Interp) Contexts() []*Context {
	it.mu.Lock()
	defer it.mu.Unlock()
	out := make([]*Context, 0, len(it.contexts))
	for _, c := range it.contexts {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Language != out[j].Language {
			return out[i].Language < out[j].Language
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// RemoveContext stops the context's kernel and forgets it. A removed
// default context is replaced by a new one on the next execution in its
// language.
func (it *Interp) RemoveContext(id string) error {
	it.mu.Lock()
	c, ok := it.contexts[id]
	delete(it.contexts, id)
	if ok && it.defaults[c.Language] == c {
		delete(it.defaults, c.Language)
	}
	it.mu.Unlock()
	if !ok {
		return fmt.Errorf("context %q not found: %w", id, errdefs.ErrNotFound)
	}
	c.remove()
	return nil
}

// Close stops every kernel.
func (it *Interp) Close() {
	for _, c := range it.Contexts() {
		c.remove()
	}
}
