package cubelet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// upperDir is the overlay upper dir in a sandbox's state dir when its
// writable layer is on the host (no disk image; see nsrt prepareLayer).
const upperDir = "upper"

// CommitSandbox is Commit as the node API reports it.
func (c *Cubelet) CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) (nodeproto.Template, error) {
	t, err := c.Commit(ctx, req)
	if err != nil {
		return nodeproto.Template{}, err
	}
	out := nodeproto.Template{Name: t.Name, Digest: t.Digest, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
		Layers: LayerDigests(t)}
	if out.DefaultsJSON, err = t.DefaultsJSON(); err != nil {
		return nodeproto.Template{}, err
	}
	return out, nil
}

// Commit registers the filesystem of a running sandbox made with
// WritableOnHost as the template req.Name (replacing one of that name):
// a hard-link copy of the sandbox's template with the sandbox's overlay
// upper dir applied on top (template.LinkTree, template.ApplyUpper), which
// the registry stores as a layer over the parent (Meta.Parent). The
// sandbox is frozen while its upper dir is read and thawed after; it keeps
// running. Sizes default to the parent template's, defaults are merged onto
// the parent's (see mergeDefaults).
func (c *Cubelet) Commit(ctx context.Context, req nodeproto.CommitRequest) (template.Template, error) {
	if err := template.ValidateName(req.Name); err != nil {
		return template.Template{}, err
	}
	if req.CPUCount < 0 || req.MemoryMB < 0 {
		return template.Template{}, fmt.Errorf("commit: cpu count and memory must not be negative: %w", errdefs.ErrInvalidArgument)
	}
	unlock := c.lock(req.SandboxID)
	defer unlock()
	rec, err := c.store.Get(req.SandboxID)
	if err != nil {
		return template.Template{}, err
	}
	if rec.State != nodestore.StateRunning {
		return template.Template{}, fmt.Errorf("sandbox %s is %s, not running: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	if c.diskSizeMB(rec) > 0 {
		return template.Template{}, fmt.Errorf("sandbox %s keeps its writable layer on a disk image: only sandboxes created with WritableOnHost (a build sandbox) can be committed: %w",
			rec.ID, errdefs.ErrFailedPrecondition)
	}
	if req.Name == rec.Template {
		return template.Template{}, fmt.Errorf("sandbox %s runs on template %q: commit it under another name: %w", rec.ID, req.Name, errdefs.ErrFailedPrecondition)
	}
	if users := c.templateUsers(req.Name); len(users) > 0 {
		return template.Template{}, fmt.Errorf("template %q is in use by sandbox(es) %s on this node: kill them or commit under another name: %w",
			req.Name, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	parent, err := c.templates.Get(ctx, rec.Template)
	if err != nil {
		return template.Template{}, fmt.Errorf("parent template of sandbox %s: %w", rec.ID, err)
	}
	dir := c.sandboxDir(rec.Runtime())
	upper := filepath.Join(dir, upperDir)
	if fi, err := os.Lstat(upper); err != nil || !fi.IsDir() {
		return template.Template{}, fmt.Errorf("sandbox %s has no writable layer at %s (%v): %w", rec.ID, upper, err, errdefs.ErrFailedPrecondition)
	}
	if _, err := os.Lstat(nsrt.DiskImagePath(dir)); !errors.Is(err, fs.ErrNotExist) {
		return template.Template{}, fmt.Errorf("sandbox %s has a disk image: only WritableOnHost sandboxes can be committed: %w", rec.ID, errdefs.ErrFailedPrecondition)
	}

	start := time.Now()
	var frozen time.Duration
	meta := template.Meta{
		CPUCount: pick(req.CPUCount, parent.CPUCount), MemoryMB: pick(req.MemoryMB, parent.MemoryMB), DiskSizeMB: parent.DiskSizeMB,
		Source:   fmt.Sprintf("commit:%s of %s", rec.ID, parent.Name),
		Defaults: mergeDefaults(parent.Defaults, req.Defaults),
		Parent:   &parent, // layered: the build's changes become <name>/layer
	}
	t, err := c.templates.Register(ctx, req.Name, meta, func(ctx context.Context, rootfs string) error {
		// The parent's tree first, while the sandbox runs: only the
		// upper dir needs it frozen.
		if err := template.LinkTree(ctx, parent.RootfsPath, rootfs); err != nil {
			return err
		}
		t0 := time.Now()
		defer func() { frozen = time.Since(t0) }()
		return c.frozen(ctx, rec, func() error {
			return template.ApplyUpper(ctx, upper, rootfs, perSandboxPath)
		})
	})
	if err != nil {
		return template.Template{}, fmt.Errorf("commit sandbox %s as %q: %w", rec.ID, req.Name, err)
	}
	c.log.Info("sandbox committed", "sandbox", rec.ID, "template", t.Name, "parent", parent.Name, "digest", t.Digest,
		"duration", time.Since(start).Round(time.Millisecond), "frozen", frozen.Round(time.Millisecond))
	c.templateArrived(t.Name)
	return t, nil
}

// frozen runs fn with the sandbox's processes frozen, and thaws them after
// unless the sandbox was paused already. The caller holds the sandbox lock.
func (c *Cubelet) frozen(ctx context.Context, rec nodestore.Sandbox, fn func() error) (err error) {
	sb, err := nsrt.Attach(ctx, c.sandboxDir(rec.Runtime()))
	if err != nil {
		return fmt.Errorf("reach sandbox %s: %w", rec.ID, err)
	}
	defer sb.Close()
	if err := sb.Freeze(ctx); err != nil {
		return fmt.Errorf("freeze sandbox %s: %w", rec.ID, err)
	}
	if !rec.Paused {
		defer func() {
			if terr := sb.Thaw(context.WithoutCancel(ctx)); terr != nil {
				err = errors.Join(err, fmt.Errorf("thaw sandbox %s: %w", rec.ID, terr))
			}
		}()
	}
	return fn()
}

// perSandboxPath reports the paths of a sandbox's writable layer that
// belong to that sandbox, not to a template made of it: envd's directory
// (its config holds the sandbox's access token; envd and the reaper are
// bound there) and the files written per sandbox at every start.
func perSandboxPath(rel string) bool {
	switch rel {
	case template.EnvdMountPoint, "etc/hosts", "etc/hostname", "etc/resolv.conf":
		return true
	}
	return false
}

// templateUsers lists the sandboxes and pool slots on this node whose
// template is name: replacing it would pull the lower layer from under them.
func (c *Cubelet) templateUsers(name string) []string {
	good, _ := c.store.List()
	var ids []string
	for _, r := range good {
		if r.Template == name {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// mergeDefaults puts a commit's defaults onto the parent template's: env
// overlaid, the others replaced when set. Nil when there are none.
func mergeDefaults(parent *template.Defaults, d nodeproto.TemplateDefaults) *template.Defaults {
	var out template.Defaults
	if parent != nil {
		out = *parent
		out.Env = maps.Clone(parent.Env)
	}
	if len(d.Env) > 0 {
		if out.Env == nil {
			out.Env = map[string]string{}
		}
		maps.Copy(out.Env, d.Env)
	}
	for _, f := range []struct {
		dst *string
		v   string
	}{
		{&out.Workdir, d.Workdir}, {&out.User, d.User}, {&out.StartCmd, d.StartCmd}, {&out.ReadyCmd, d.ReadyCmd},
	} {
		if f.v != "" {
			*f.dst = f.v
		}
	}
	if parent == nil && len(out.Env) == 0 && out.Workdir == "" && out.User == "" && out.StartCmd == "" && out.ReadyCmd == "" {
		return nil
	}
	return &out
}
