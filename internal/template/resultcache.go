package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// ResultCache is the cache of a template built by a recipe, shared between
// data dirs through the registry's CacheDir: <key>.tar holds the rootfs,
// <key>.json the metadata (sizes, defaults). The caller derives key from
// everything that decides the result (recipe and parent), so a changed
// recipe misses the cache.
type ResultCache struct {
	r   *Registry
	key string
}

// ResultCache returns the result cache named key (file name rules: the
// caller passes a name and a hex hash).
func (r *Registry) ResultCache(key string) ResultCache { return ResultCache{r: r, key: key} }

func (c ResultCache) file() string { return filepath.Join(c.r.cacheDir(), c.key+".tar") }

// resultMeta is <key>.json.
type resultMeta struct {
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	DiskSizeMB int       `json:"diskSizeMB"`
	Source     string    `json:"source"`
	Defaults   *Defaults `json:"defaults,omitempty"`
}

// Register registers template name from the cache; ok is false (nothing
// registered) when there is no usable cache. An unusable cache is removed.
func (c ResultCache) Register(ctx context.Context, name string, progress io.Writer) (t Template, ok bool, err error) {
	file := c.file()
	unlock, err := flock(ctx, file+".lock")
	if err != nil {
		return Template{}, false, err
	}
	defer unlock()
	raw, err := os.ReadFile(file + ".json")
	if errors.Is(err, fs.ErrNotExist) {
		return Template{}, false, nil
	}
	var m resultMeta
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	if err != nil {
		fmt.Fprintf(progress, "cube: cache %s is unusable (%v); rebuilding\n", file, err)
		_ = os.Remove(file + ".json")
		return Template{}, false, nil
	}
	cached := false
	t, err = c.r.Register(ctx, name, Meta{CPUCount: m.CPUCount, MemoryMB: m.MemoryMB, DiskSizeMB: m.DiskSizeMB, Source: m.Source + " (cached)", Defaults: m.Defaults},
		func(ctx context.Context, rootfs string) error {
			var err error
			cached, err = fillFromCache(ctx, file, rootfs, "template "+name, progress)
			if err == nil && !cached {
				err = errNoCache
			}
			return err
		})
	if errors.Is(err, errNoCache) {
		_ = os.Remove(file + ".json")
		return Template{}, false, nil
	}
	if err != nil {
		return Template{}, false, err
	}
	return t, true, nil
}

var errNoCache = errors.New("no cache")

// BuildLock serialises the builds that fill the cache, across processes
// (two cubelets on one machine): the second finds the first's result in
// the cache instead of building it again. Release it with unlock.
func (c ResultCache) BuildLock(ctx context.Context) (unlock func(), err error) {
	file := c.file()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return nil, fmt.Errorf("create cache dir: %w", err)
	}
	return flock(ctx, file+".build.lock")
}

// Save writes template t's rootfs and metadata to the cache, unless it is
// there already. The metadata is written last: it is what Register looks for.
func (c ResultCache) Save(ctx context.Context, t Template) error {
	file := c.file()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("create cache dir: %w", err)
	}
	unlock, err := flock(ctx, file+".lock")
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(file + ".json"); err == nil {
		return nil
	}
	// Under the lock no one else writes: a temporary file is what a killed
	// Save left (hundreds of MB).
	stale, _ := filepath.Glob(file + ".tmp-*")
	for _, f := range stale {
		_ = os.Remove(f)
	}
	if err := writeTarCache(ctx, t.RootfsPath, file); err != nil {
		return err
	}
	raw, err := json.Marshal(resultMeta{CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB, Source: t.Source, Defaults: t.Defaults})
	if err != nil {
		return err
	}
	return os.WriteFile(file+".json", raw, 0o644)
}
