package roles

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/proxy"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// nodeSandboxes runs the build sandboxes of built-in recipes on one node,
// straight through its cubelet: no server, master or store is involved
// (a cube cubelet builds code-interpreter-v1 itself, as it builds base).
// The sandboxes are known only here, so the node's heartbeat leaves them
// out (hidden): a server would otherwise kill them as strays. One that a
// crash leaves behind is no longer hidden and is killed as a stray.
type nodeSandboxes struct {
	node func() *cubelet.Cubelet // late-bound: the fetcher exists before the node

	mu     sync.Mutex
	tokens map[string]string // running build sandboxes -> envd access token
}

var _ templatebuild.Sandboxes = (*nodeSandboxes)(nil)

func newNodeSandboxes(node func() *cubelet.Cubelet) *nodeSandboxes {
	return &nodeSandboxes{node: node, tokens: map[string]string{}}
}

// buildIDPrefix starts the ids of recipe build sandboxes (ids the master
// makes never start so).
const buildIDPrefix = "recipe-build-"

func (n *nodeSandboxes) get() (*cubelet.Cubelet, error) {
	if n == nil || n.node == nil {
		return nil, fmt.Errorf("recipe builds: no node: %w", errdefs.ErrUnavailable)
	}
	c := n.node()
	if c == nil {
		return nil, fmt.Errorf("recipe builds: the node is not started yet: %w", errdefs.ErrUnavailable)
	}
	return c, nil
}

func (n *nodeSandboxes) CreateBuildSandbox(ctx context.Context, parent string, cpuCount, memoryMB int) (string, error) {
	c, err := n.get()
	if err != nil {
		return "", err
	}
	b := make([]byte, 8)
	rand.Read(b)
	id, token := buildIDPrefix+hex.EncodeToString(b), randomToken()
	n.mu.Lock()
	n.tokens[id] = token
	n.mu.Unlock()
	if _, err := c.CreateSandbox(ctx, cubelet.CreateRequest{SandboxID: id, Template: parent, CPUCount: cpuCount, MemoryMB: memoryMB,
		EnvdAccessToken: token, AllowInternet: true, WritableOnHost: true}); err != nil {
		n.forget(id)
		return "", err
	}
	return id, nil
}

func (n *nodeSandboxes) Envd(ctx context.Context, id string) (*http.Client, string, string, error) {
	c, err := n.get()
	if err != nil {
		return nil, "", "", err
	}
	n.mu.Lock()
	token, ok := n.tokens[id]
	n.mu.Unlock()
	if !ok {
		return nil, "", "", fmt.Errorf("build sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	addr, err := c.SandboxAddr(ctx, id, proxy.EnvdPort)
	if err != nil {
		return nil, "", "", err
	}
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: c.DialContext}}, "http://" + addr, token, nil
}

func (n *nodeSandboxes) CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) error {
	c, err := n.get()
	if err != nil {
		return err
	}
	_, err = c.CommitSandbox(ctx, req)
	return err
}

func (n *nodeSandboxes) KillSandbox(ctx context.Context, id string) error {
	c, err := n.get()
	if err != nil {
		return err
	}
	err = c.KillSandbox(ctx, id)
	n.forget(id)
	return err
}

func (n *nodeSandboxes) forget(id string) {
	n.mu.Lock()
	delete(n.tokens, id)
	n.mu.Unlock()
}

// hidden reports whether sandbox id is a running recipe build of this
// process (left out of the node's heartbeat).
func (n *nodeSandboxes) hidden(id string) bool {
	if n == nil {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.tokens[id]
	return ok
}

// recipeBuilder builds a built-in template from its recipe on a node.
type recipeBuilder struct {
	recipe    templatebuild.Recipe
	templates *template.Registry
	sandboxes *nodeSandboxes
	log       *slog.Logger
}

// ensure returns the recipe's template: the one in the registry when the
// current recipe built it; else the cached result of this recipe on this
// base (CacheDir, shared between data dirs); else built by
// templatebuild.Executor in a sandbox of base and then cached. A template
// an older recipe built is replaced, unless a sandbox or pool slot still
// uses it (or the rebuild fails): then it is kept, with a warning.
func (b recipeBuilder) ensure(ctx context.Context, progress io.Writer) (template.Template, error) {
	if progress == nil {
		progress = io.Discard
	}
	name := b.recipe.Name
	old, err := b.templates.Get(ctx, name)
	if err == nil && b.recipe.Built(old) {
		return old, nil
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return template.Template{}, err
	}
	stale := err == nil
	start := time.Now()
	cache, cached := b.cache(ctx)
	if cached {
		// One build per machine: another process building the same
		// recipe on the same base leaves its result in the cache.
		unlock, err := cache.BuildLock(ctx)
		if err != nil {
			return template.Template{}, err
		}
		defer unlock()
		if !stale {
			if t, ok, err := cache.Register(ctx, name, progress); err != nil || ok {
				return t, err
			}
		}
	}
	fmt.Fprintf(progress, "cube: template %s: building from its recipe (%d steps on %s)\n", name, len(b.recipe.Spec.Steps), b.recipe.Spec.FromTemplate)
	ex := templatebuild.Executor{Sandboxes: b.sandboxes, Templates: templatebuild.RegistryTemplates{Registry: b.templates}, Logger: b.log,
		Log: func(level, step, msg string) { fmt.Fprintf(progress, "cube: template %s: [%s] %s\n", name, step, msg) }}
	if err := ex.Execute(ctx, templatebuild.Target{Name: name}, b.recipe.Spec); err != nil {
		if stale && ctx.Err() == nil {
			// Most likely in use (a sandbox or pool slot runs it: the
			// commit refuses to replace its layer); the old one works.
			b.log.Warn("could not rebuild a template an older recipe made: keeping it", "template", name, "err", err)
			return old, nil
		}
		return template.Template{}, err
	}
	t, err := b.templates.Get(ctx, name)
	if err != nil {
		return template.Template{}, err
	}
	fmt.Fprintf(progress, "cube: template %s: built in %s\n", name, time.Since(start).Round(time.Second))
	b.saveCache(ctx, t, progress)
	return t, nil
}

// cache is where the recipe's result on the local base is cached: keyed on
// the recipe's key and base's digest. ok is false when base is not on the
// node yet (the build fetches it).
func (b recipeBuilder) cache(ctx context.Context) (template.ResultCache, bool) {
	base, err := b.templates.Get(ctx, b.recipe.Spec.FromTemplate)
	if err != nil || base.Digest == "" {
		return template.ResultCache{}, false
	}
	key := sha256.Sum256([]byte(b.recipe.Key + "\n" + base.Digest))
	return b.templates.ResultCache(b.recipe.Name + "-" + hex.EncodeToString(key[:6])), true
}

// saveCache caches a built template; a failure only costs the next data
// dir a build.
func (b recipeBuilder) saveCache(ctx context.Context, t template.Template, progress io.Writer) {
	c, ok := b.cache(ctx)
	if !ok {
		return
	}
	if err := c.Save(ctx, t); err != nil {
		fmt.Fprintf(progress, "cube: could not cache template %s: %v\n", t.Name, err)
	}
}

// drain waits (at most bound) until no recipe build sandbox runs: a build
// whose ctx ended kills its sandbox on the way out, and that must happen
// before the node closes (the sandbox would outlive the agent, unknown to
// every server).
func (n *nodeSandboxes) drain(bound time.Duration) {
	deadline := time.Now().Add(bound)
	for {
		n.mu.Lock()
		left := len(n.tokens)
		n.mu.Unlock()
		if left == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
