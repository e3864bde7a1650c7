package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Defaults of the collection of build leftovers.
const (
	// DefaultLeftoverAge is how long a leftover stays unused before it is
	// collected: a week of rebuilds keep hitting the step cache.
	DefaultLeftoverAge = 7 * 24 * time.Hour
	// DefaultCollectEvery is how often the service collects.
	DefaultCollectEvery = time.Hour
	// orphanChunkAge is how old the stored chunks of an upload that never
	// completed (its server died while copying it) are before they go; no
	// copy into the store takes that long.
	orphanChunkAge = time.Hour
)

// Collected is what one collection removed.
type Collected struct {
	Templates []string // buildcache-* and image-* templates
	Files     []string // hashes of uploaded COPY archives
	// Layers are digests of template layers in the store that no template
	// record references any more (a built template deleted or rebuilt;
	// cluster mode ships built templates as layers).
	Layers []string
	// Skipped is set when builds were running: nothing was collected (a
	// running build may be about to start from a cache template).
	Skipped bool
}

// CollectLeftovers removes what builds leave behind and no longer use:
// step-cache templates (buildcache-*) and imported image templates
// (image-*) created more than maxAge ago that no sandbox uses, and
// uploaded COPY archives unused (not uploaded, linked or built with) for
// maxAge, and stored template layers no record has referenced for an
// hour. Templates built from them keep working: a built template is a
// full copy sharing file data by hard links. It does nothing while builds
// run on any replica (Skipped). Every replica collects: each removal is
// idempotent (a template gone already is no error, a file is removed only
// if still unused). Errors of single removals are joined; the rest go on.
func (s *Service) CollectLeftovers(ctx context.Context, maxAge time.Duration) (Collected, error) {
	if !s.gcMu.TryLock() {
		return Collected{Skipped: true}, nil
	}
	defer s.gcMu.Unlock()
	// Builds of other replicas count too: the store knows them all.
	if running, err := s.cfg.Store.UnfinishedTemplateBuilds(ctx); err != nil {
		return Collected{}, fmt.Errorf("collect build leftovers: %w", err)
	} else if len(running) > 0 {
		return Collected{Skipped: true}, nil
	}
	cutoff := s.now().Add(-maxAge)
	var out Collected
	var errs []error
	tpls, err := s.cfg.Templates.List(ctx)
	if err != nil {
		return out, fmt.Errorf("collect build leftovers: %w", err)
	}
	for _, t := range tpls {
		if !strings.HasPrefix(t.Name, CachePrefix) && !IsImageTemplate(t.Name) || !t.CreatedAt.Before(cutoff) {
			continue
		}
		if err := s.inUse(ctx, t.Name, "delete it"); err != nil {
			if !errors.Is(err, errdefs.ErrConflict) {
				errs = append(errs, err)
			}
			continue
		}
		if err := s.cfg.Templates.Delete(ctx, t.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete %s: %w", t.Name, err))
			continue
		}
		out.Templates = append(out.Templates, t.Name)
	}
	untagged, err := s.collectUntagged(ctx, tpls, maxAge) // tags.go
	out.Templates, errs = append(out.Templates, untagged...), append(errs, err)
	// Conditional on each file's last use: a file linked or built with
	// meanwhile, on any replica, stays.
	files, err := s.cfg.Store.DeleteUnusedTemplateFiles(ctx, cutoff, s.now().Add(-orphanChunkAge))
	errs = append(errs, err)
	out.Files = files
	// A layer is recorded right after it is stored: an hour unreferenced
	// means its template is gone (or its record was never written).
	layers, err := s.cfg.Store.DeleteUnusedLayers(ctx, s.now().Add(-orphanChunkAge))
	errs = append(errs, err)
	out.Layers = layers
	return out, errors.Join(errs...)
}

// collectOnce collects leftovers once (every cfg.CollectEvery, see every).
func (s *Service) collectOnce() {
	c, err := s.CollectLeftovers(s.ctx, s.cfg.LeftoverAge)
	if err != nil {
		s.log.Warn("collect build leftovers", "err", err)
	}
	if len(c.Templates)+len(c.Files)+len(c.Layers) > 0 {
		s.log.Info("collected build leftovers", "templates", c.Templates, "files", len(c.Files), "layers", len(c.Layers))
	}
}
