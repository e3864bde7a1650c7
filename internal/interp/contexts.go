package interp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Context is one execution context of the code-interpreter API: a kernel
// of one language with its own state, working directory and global
// environment. Executions in a context run one at a time.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	spec KernelSpec
	it   *Interp

	run sync.Mutex // held by the execution (or kernel start) in progress

	mu            sync.Mutex // guards the fields below
	k             *kernel
	removed       bool
	globalApplied bool // the sandbox's env vars are set in the current kernel
}

// kernel returns the context's kernel, starting one when it has none or
// the last one died. The caller holds c.run.
func (c *Context) kernel(ctx context.Context) (*kernel, error) {
	c.mu.Lock()
	k, removed := c.k, c.removed
	c.mu.Unlock()
	if removed {
		return nil, fmt.Errorf("context %s: %w", c.ID, errdefs.ErrNotFound)
	}
	if k != nil && k.alive() {
		return k, nil
	}
	if k != nil {
		k.kill() // collect the dead one's sockets and directory
	}
	k, err := startKernel(ctx, c.spec, c.it.kernelOpts(c.Cwd))
	if err != nil {
		return nil, fmt.Errorf("start %s kernel for context %s: %w: %w", c.Language, c.ID, err, errdefs.ErrUnavailable)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed { // removed while starting
		k.stop(errStopRemoved)
		return nil, fmt.Errorf("context %s: %w", c.ID, errdefs.ErrNotFound)
	}
	c.k, c.globalApplied = k, false
	return k, nil
}

// setEnv runs, silently, the code that sets the sandbox's env vars global
// (read from envd for this execution; nil without envd) once per kernel,
// and the execution's own vars. It returns the code that undoes the
// execution's vars afterwards.
func (c *Context) setEnv(ctx context.Context, k *kernel, global, vars map[string]string) (undo string, err error) {
	c.mu.Lock()
	applied := c.globalApplied
	c.mu.Unlock()
	set := map[string]string{}
	if !applied {
		for name, v := range global {
			set[name] = v
		}
	}
	for name, v := range vars {
		set[name] = v
	}
	if len(set) == 0 {
		return "", nil
	}
	if c.spec.Language != "python" {
		if len(vars) > 0 {
			return "", fmt.Errorf("envs for %s executions: only python kernels take per-execution env vars: %w",
				c.Language, errdefs.ErrInvalidArgument)
		}
		return "", nil
	}
	if err := k.execute(ctx, pythonSetEnv(set), true, func(any) error { return nil }); err != nil {
		return "", fmt.Errorf("set env vars: %w", err)
	}
	if !applied && global != nil {
		c.mu.Lock()
		c.globalApplied = true
		c.mu.Unlock()
	}
	if len(vars) == 0 {
		return "", nil
	}
	restore, drop := map[string]string{}, []string{}
	for name := range vars {
		if v, ok := global[name]; ok {
			restore[name] = v
		} else {
			drop = append(drop, name)
		}
	}
	sort.Strings(drop)
	return pythonRestoreEnv(drop, restore), nil
}

// pythonSetEnv is Python code setting vars in os.environ. JSON string and
// object literals are valid Python literals, so values need no quoting of
// their own.
func pythonSetEnv(vars map[string]string) string {
	b, _ := json.Marshal(vars)
	return "import os as _cube_os\n_cube_os.environ.update(" + string(b) + ")\ndel _cube_os\n"
}

func pythonRestoreEnv(drop []string, restore map[string]string) string {
	d, _ := json.Marshal(drop)
	r, _ := json.Marshal(restore)
	return "import os as _cube_os\nfor _cube_k in " + string(d) + ":\n    _cube_os.environ.pop(_cube_k, None)\n" +
		"_cube_os.environ.update(" + string(r) + ")\ndel _cube_os\n"
}

// restart replaces the context's kernel by a fresh one: all state is
// lost. An execution in progress ends with a ContextRestarting error.
func (c *Context) restart(ctx context.Context) error {
	c.mu.Lock()
	old := c.k
	c.k = nil
	c.mu.Unlock()
	if old != nil {
		old.stop(errStopRestarted)
	}
	c.run.Lock()
	defer c.run.Unlock()
	_, err := c.kernel(ctx)
	return err
}

// remove stops the context's kernel for good.
func (c *Context) remove() {
	c.mu.Lock()
	old := c.k
	c.k, c.removed = nil, true
	c.mu.Unlock()
	if old != nil {
		old.stop(errStopRemoved)
	}
}

// checkCwd reports whether dir can be a context's working directory.
func checkCwd(dir string) error {
	if !strings.HasPrefix(dir, "/") {
		return fmt.Errorf("cwd %q: must be an absolute path: %w", dir, errdefs.ErrInvalidArgument)
	}
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cwd %q does not exist in the sandbox; create it first: %w", dir, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return fmt.Errorf("cwd %q: %w", dir, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("cwd %q is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	return nil
}
