// Package template is the on-disk template registry: a read-only root
// filesystem plus metadata per template, imported from a directory or a
// tarball, or built with debootstrap (the default `base` template).
//
// Layout under Registry.Dir (usually <data-dir>/templates):
//
//	<name>/rootfs          read-only root filesystem (an overlayfs lowerdir)
//	<name>/layer           a layered template's top layer (see layer.go)
//	<name>/template.json   metadata (see Template)
//	.tmp-<name>-<rand>/    a build in progress; removed by the next call for <name>
//	.lock-<name>           flock serialising writers of <name>
//
// Registration is atomic: a template is built under a .tmp directory and
// renamed into place only when complete.
package template

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"

	"github.com/cube-dev/cube/internal/atomicfile"
)

// Defaults applied to every newly registered template.
const (
	DefaultCPUCount   = 2
	DefaultMemoryMB   = 512
	DefaultDiskSizeMB = 1024
)

const (
	metaFile   = "template.json"
	rootfsDir  = "rootfs"
	tmpPrefix  = ".tmp-"
	delPrefix  = ".del-"
	lockPrefix = ".lock-"
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// Template is a registered template as stored in template.json.
type Template struct {
	Name       string    `json:"name"`
	RootfsPath string    `json:"-"` // absolute path of the read-only rootfs
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	DiskSizeMB int       `json:"diskSizeMB"`
	CreatedAt  time.Time `json:"createdAt"`
	Source     string    `json:"source"` // e.g. "dir:/path", "tar:/path.tar.gz", "debootstrap:bookworm ..."
	Digest     string    `json:"digest"` // "sha256:<hex>" over a canonical walk of the rootfs (see Digest)
	// Defaults of the sandboxes made from the template (from a container
	// image's config); nil for templates without any.
	Defaults *Defaults `json:"defaults,omitempty"`
	// Layers is the full stack, bottom first, of a layered template (see
	// LayerChain); empty for a flat template.
	Layers []LayerRef `json:"layers,omitempty"`
}

// Registry stores templates on disk. The zero value is not usable: Dir must
// be set. Methods are safe for concurrent use, also across processes.
type Registry struct {
	// Dir is the templates directory, usually <data-dir>/templates.
	Dir string
	// CacheDir holds build caches shared between data dirs (the debootstrap
	// result of `base`). Empty means DefaultCacheDir().
	CacheDir string
}

// NewRegistry returns a registry for <dataDir>/templates using the default
// cache directory.
func NewRegistry(dataDir string) *Registry {
	return &Registry{Dir: filepath.Join(dataDir, "templates"), CacheDir: DefaultCacheDir()}
}

// DefaultCacheDir is $CUBE_CACHE_DIR, else /var/cache/cube.
func DefaultCacheDir() string {
	if d := os.Getenv("CUBE_CACHE_DIR"); d != "" {
		return d
	}
	return "/var/cache/cube"
}

func (r *Registry) cacheDir() string {
	if r.CacheDir != "" {
		return r.CacheDir
	}
	return DefaultCacheDir()
}

// ValidateName reports whether name is a valid template name.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("template name %q: must match %s: %w", name, nameRE, errdefs.ErrInvalidArgument)
	}
	return nil
}

// List returns all registered templates sorted by name. Directories without
// a readable template.json (e.g. half-deleted ones) are skipped.
func (r *Registry) List(ctx context.Context) ([]Template, error) {
	entries, err := os.ReadDir(r.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Template
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !e.IsDir() || ValidateName(e.Name()) != nil {
			continue
		}
		t, err := r.load(e.Name())
		if err != nil {
			continue
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Get returns the template called name, or an error wrapping
// errdefs.ErrNotFound.
func (r *Registry) Get(ctx context.Context, name string) (Template, error) {
	if err := ValidateName(name); err != nil {
		return Template{}, err
	}
	if err := ctx.Err(); err != nil {
		return Template{}, err
	}
	return r.load(name)
}

func (r *Registry) load(name string) (Template, error) {
	dir := filepath.Join(r.Dir, name)
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return Template{}, fmt.Errorf("read template %q: %w", name, err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return Template{}, fmt.Errorf("parse %s: %w", filepath.Join(dir, metaFile), err)
	}
	if t.Name != name {
		return Template{}, fmt.Errorf("template %q: metadata names %q: %w", name, t.Name, errdefs.ErrFailedPrecondition)
	}
	t.RootfsPath = filepath.Join(dir, rootfsDir)
	return t, nil
}

// Delete removes the template called name. The caller must make sure no
// sandbox still uses its rootfs as a lower layer.
func (r *Registry) Delete(ctx context.Context, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	unlock, err := r.lock(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	r.cleanStale(name)
	dir := filepath.Join(r.Dir, name)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	// Rename first so the template disappears atomically; then remove.
	trash := filepath.Join(r.Dir, delPrefix+name+"-"+randSuffix())
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("delete template %q: %w", name, err)
	}
	if err := removeTree(trash); err != nil {
		return fmt.Errorf("delete template %q: %w", name, err)
	}
	return nil
}

// build runs fill on a fresh staging directory (fill populates <staging>/rootfs
// and returns the source description), then prepares the rootfs, computes the
// digest, writes template.json and renames the staging directory into place.
// The caller must hold the name lock.
func (r *Registry) build(ctx context.Context, name string, fill func(ctx context.Context, rootfs string) (string, error)) (Template, error) {
	return r.buildDigest(ctx, name, "", fill)
}

// buildDigest is build that, when want is set, refuses (and discards) the
// result unless its digest equals want.
func (r *Registry) buildDigest(ctx context.Context, name, want string, fill func(ctx context.Context, rootfs string) (string, error)) (Template, error) {
	return r.buildSpec(ctx, name, buildSpec{want: want, fill: fill})
}

// buildSpec says how buildWith fills and finishes a template.
type buildSpec struct {
	want string // expected digest, if any
	// fill populates rootfs and returns the template's Source.
	fill func(ctx context.Context, rootfs string) (string, error)
	// finish, if set, runs on the prepared rootfs before the digest is
	// taken and may set metadata on t (Defaults; sizes, 0 = default).
	finish func(ctx context.Context, rootfs string, t *Template) error
	// replace lets the build replace a template of the same name.
	replace bool
}

func (r *Registry) buildSpec(ctx context.Context, name string, spec buildSpec) (t Template, err error) {
	want, fill := spec.want, spec.fill
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return Template{}, fmt.Errorf("create templates dir: %w", err)
	}
	r.cleanStale(name)
	final := filepath.Join(r.Dir, name)
	_, statErr := os.Lstat(final)
	exists := statErr == nil
	if exists && !spec.replace {
		return Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrAlreadyExists)
	}
	staging := filepath.Join(r.Dir, tmpPrefix+name+"-"+randSuffix())
	if err := os.Mkdir(staging, 0o755); err != nil {
		return Template{}, fmt.Errorf("create staging dir: %w", err)
	}
	defer func() {
		if err != nil {
			_ = removeTree(staging)
		}
	}()
	rootfs := filepath.Join(staging, rootfsDir)
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Template{}, fmt.Errorf("create rootfs dir: %w", err)
	}
	source, err := fill(ctx, rootfs)
	if err != nil {
		return Template{}, err
	}
	if err := PrepareRootfs(ctx, rootfs); err != nil {
		return Template{}, err
	}
	if spec.finish != nil {
		if err := spec.finish(ctx, rootfs, &t); err != nil {
			return Template{}, err
		}
	}
	digest, err := Digest(ctx, rootfs)
	if err != nil {
		return Template{}, err
	}
	if want != "" && digest != want {
		return Template{}, fmt.Errorf("template %q: imported content has digest %s, want %s (corrupt or tampered; nothing registered): %w",
			name, digest, want, errdefs.ErrConflict)
	}
	t = Template{
		Name:       name,
		CPUCount:   cmp.Or(t.CPUCount, DefaultCPUCount), // finish may set sizes
		MemoryMB:   cmp.Or(t.MemoryMB, DefaultMemoryMB),
		DiskSizeMB: cmp.Or(t.DiskSizeMB, DefaultDiskSizeMB),
		CreatedAt:  time.Now().UTC().Truncate(time.Second),
		Source:     source,
		Digest:     digest,
		Defaults:   t.Defaults,
		Layers:     t.Layers,
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return Template{}, fmt.Errorf("encode metadata: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(staging, metaFile), append(b, '\n'), 0o644); err != nil {
		return Template{}, fmt.Errorf("write metadata: %w", err)
	}
	if err := r.swapIn(staging, final, exists); err != nil {
		return Template{}, fmt.Errorf("register template %q: %w", name, err)
	}
	atomicfile.SyncDir(r.Dir)
	t.RootfsPath = filepath.Join(final, rootfsDir)
	return t, nil
}

// register validates name, takes the name lock and builds.
func (r *Registry) register(ctx context.Context, name string, fill func(ctx context.Context, rootfs string) (string, error)) (Template, error) {
	return r.registerDigest(ctx, name, "", fill)
}

// registerDigest is register with buildDigest's digest check.
func (r *Registry) registerDigest(ctx context.Context, name, want string, fill func(ctx context.Context, rootfs string) (string, error)) (Template, error) {
	return r.registerSpec(ctx, name, buildSpec{want: want, fill: fill})
}

// registerSpec validates name, takes the name lock and builds after spec.
func (r *Registry) registerSpec(ctx context.Context, name string, spec buildSpec) (Template, error) {
	if err := ValidateName(name); err != nil {
		return Template{}, err
	}
	if r.Dir == "" {
		return Template{}, fmt.Errorf("template registry has no directory: %w", errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return Template{}, fmt.Errorf("create templates dir: %w", err)
	}
	unlock, err := r.lock(ctx, name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	return r.buildSpec(ctx, name, spec)
}

// cleanStale removes leftovers of crashed builds or deletes of name. The
// caller holds the name lock, so no live build of name owns them.
func (r *Registry) cleanStale(name string) {
	entries, err := os.ReadDir(r.Dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		n := e.Name()
		for _, p := range []string{tmpPrefix, delPrefix} {
			rest, ok := strings.CutPrefix(n, p+name+"-")
			if ok && len(rest) == 16 && isHex(rest) {
				_ = removeTree(filepath.Join(r.Dir, n))
			}
		}
	}
}

// Cleanup removes leftovers of crashed builds and deletes of every name
// that no one is building right now. Builds and deletes clean their own name
// anyway; call Cleanup at start-up to collect the rest. EnsureBase calls it.
func (r *Registry) Cleanup(ctx context.Context) error {
	entries, err := os.ReadDir(r.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clean templates dir: %w", err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		if name, ok := staleName(e.Name()); ok {
			names[name] = true
		}
	}
	tryCtx, cancel := context.WithCancel(ctx)
	cancel() // a canceled context makes flock a single non-blocking attempt
	for name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		unlock, err := r.lock(tryCtx, name)
		if err != nil {
			continue // busy: its owner cleans up
		}
		r.cleanStale(name)
		unlock()
	}
	return nil
}

// staleName returns <name> for ".tmp-<name>-<16 hex>" and ".del-<name>-<16 hex>".
func staleName(entry string) (string, bool) {
	for _, p := range []string{tmpPrefix, delPrefix} {
		rest, ok := strings.CutPrefix(entry, p)
		if !ok || len(rest) < 18 || rest[len(rest)-17] != '-' || !isHex(rest[len(rest)-16:]) {
			continue
		}
		name := rest[:len(rest)-17]
		if ValidateName(name) == nil {
			return name, true
		}
	}
	return "", false
}

func (r *Registry) lock(ctx context.Context, name string) (func(), error) {
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create templates dir: %w", err)
	}
	return flock(ctx, filepath.Join(r.Dir, lockPrefix+name))
}

func randSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}
