package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"os"
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
)

// Collected is what one collection removed.
type Collected struct {
	Templates []string // buildcache-* and image-* templates
	Files     []string // hashes of uploaded COPY archives
	// Skipped is set when builds were running: nothing was collected (a
	// running build may be about to start from a cache template).
	Skipped bool
}

// CollectLeftovers removes what builds leave behind and no longer use:
// step-cache templates (buildcache-*) and imported image templates
// (image-*) created more than maxAge ago that no sandbox uses, and
// uploaded COPY archives unused (not uploaded, linked or built with) for
// maxAge. Templates built from them keep working: a built template is a
// full copy sharing file data by hard links. It does nothing while builds
// run (Skipped). Errors of single removals are joined; the rest go on.
func (s *Service) CollectLeftovers(ctx context.Context, maxAge time.Duration) (Collected, error) {
	if !s.gcMu.TryLock() {
		return Collected{Skipped: true}, nil
	}
	defer s.gcMu.Unlock()
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
	files, err := s.files.unusedSince(cutoff)
	errs = append(errs, err)
	for _, h := range files {
		if err := os.Remove(s.files.path(h)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		out.Files = append(out.Files, h)
	}
	return out, errors.Join(errs...)
}

// collectLoop collects leftovers every cfg.CollectEvery until Close.
func (s *Service) collectLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.CollectEvery)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		c, err := s.CollectLeftovers(s.ctx, s.cfg.LeftoverAge)
		if err != nil {
			s.log.Warn("collect build leftovers", "err", err)
		}
		if len(c.Templates)+len(c.Files) > 0 {
			s.log.Info("collected build leftovers", "templates", c.Templates, "files", len(c.Files))
		}
	}
}

// used reports whether the archive of hash is stored and, if so, marks it
// used now (its modification time), which keeps it from the collector.
func (f *fileStore) used(hash string) bool {
	if !f.has(hash) {
		return false
	}
	now := time.Now()
	_ = os.Chtimes(f.path(hash), now, now)
	return true
}

// unusedSince lists the stored archives last used before cutoff.
func (f *fileStore) unusedSince(cutoff time.Time) ([]string, error) {
	entries, err := os.ReadDir(f.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list uploaded files: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !ValidHash(e.Name()) || !e.Type().IsRegular() {
			continue // temporary files of uploads in progress among them
		}
		fi, err := e.Info()
		if err == nil && fi.ModTime().Before(cutoff) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
