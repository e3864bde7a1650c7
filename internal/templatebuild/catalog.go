package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// Summary is one entry of GET /templates (E2B's Template).
type Summary struct {
	TemplateID  string
	BuildID     string // the last ready build; "" for templates not built through this API
	CPUCount    int
	MemoryMB    int
	DiskSizeMB  int
	EnvdVersion string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	BuildCount  int
	BuildStatus string // of the last build; "ready" for templates without builds
}

// List returns the templates (without the build cache's) and those whose
// first build has not finished yet, sorted by name.
func (s *Service) List(ctx context.Context) ([]Summary, error) {
	tpls, err := s.cfg.Templates.List(ctx)
	if err != nil {
		return nil, err
	}
	builds, err := s.cfg.Store.ListTemplateBuilds(ctx, "")
	if err != nil {
		return nil, err
	}
	byTemplate := map[string][]store.TemplateBuild{}
	for _, b := range builds {
		byTemplate[b.Template] = append(byTemplate[b.Template], b)
	}
	out := []Summary{}
	seen := map[string]bool{}
	for _, t := range tpls {
		if strings.HasPrefix(t.Name, CachePrefix) || IsImageTemplate(t.Name) || IsBuildTemplate(t.Name) {
			continue
		}
		seen[t.Name] = true
		sum := Summary{TemplateID: t.Name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
			EnvdVersion: t.EnvdVersion, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt, BuildStatus: string(store.BuildReady)}
		applyBuilds(&sum, byTemplate[t.Name])
		out = append(out, sum)
	}
	// Templates whose tags all point at per-build templates (tags.go).
	tagOnly, err := s.taggedOnly(ctx, seen)
	if err != nil {
		return nil, err
	}
	for _, sum := range tagOnly {
		seen[sum.TemplateID] = true
		applyBuilds(&sum, byTemplate[sum.TemplateID])
		out = append(out, sum)
	}
	for name, bs := range byTemplate {
		if seen[name] {
			continue
		}
		last := bs[len(bs)-1]
		if last.Status.Terminal() {
			continue // failed first builds leave nothing to list
		}
		sum := Summary{TemplateID: name, CPUCount: last.CPUCount, MemoryMB: last.MemoryMB, CreatedAt: bs[0].CreatedAt, UpdatedAt: last.UpdatedAt}
		applyBuilds(&sum, bs)
		out = append(out, sum)
	}
	for i := range out {
		if out[i].EnvdVersion == "" {
			out[i].EnvdVersion = DefaultEnvdVersion
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].TemplateID < out[j].TemplateID })
	return out, nil
}

// taggedOnly summarizes the templates that have tags but are not in
// seen, with the sizes of the template their default tag (else their first
// tag) points at.
func (s *Service) taggedOnly(ctx context.Context, seen map[string]bool) ([]Summary, error) {
	rows, err := s.cfg.Store.ListTemplateTags(ctx, "")
	if err != nil {
		return nil, err
	}
	pick := map[string]store.TemplateTag{}
	var names []string
	for _, r := range rows {
		old, ok := pick[r.Template]
		switch {
		case seen[r.Template]:
		case !ok:
			names = append(names, r.Template)
			pick[r.Template] = r
		case r.Tag == DefaultTag && old.Tag != DefaultTag:
			pick[r.Template] = r
		}
	}
	out := []Summary{}
	for _, name := range names {
		t, err := s.cfg.Templates.Get(ctx, pick[name].Target)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // its template went (deleted on the node): nothing to start
		}
		if err != nil {
			return nil, err
		}
		out = append(out, Summary{TemplateID: name, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
			EnvdVersion: t.EnvdVersion, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt, BuildStatus: string(store.BuildReady)})
	}
	return out, nil
}

// applyBuilds fills the build fields of sum from the template's builds,
// oldest first.
func applyBuilds(sum *Summary, bs []store.TemplateBuild) {
	sum.BuildCount = len(bs)
	if len(bs) == 0 {
		return
	}
	sum.BuildStatus = string(bs[len(bs)-1].Status)
	for i := len(bs) - 1; i >= 0; i-- {
		if bs[i].Status == store.BuildReady {
			sum.BuildID = bs[i].ID
			if bs[i].UpdatedAt.After(sum.UpdatedAt) {
				sum.UpdatedAt = bs[i].UpdatedAt
			}
			break
		}
	}
	if sum.BuildID == "" {
		sum.BuildID = bs[len(bs)-1].ID
	}
}

// Resolve returns the template an id, name or name:tag names, with Name
// the template's name (its E2B templateID; a tag's build may be held by a
// per-build template). A name without a tag exists when any tag of it
// does. ErrNotFound when there is none.
func (s *Service) Resolve(ctx context.Context, idOrName string) (TemplateInfo, error) {
	name, tag, err := ParseRef(idOrName)
	if err != nil {
		return TemplateInfo{}, fmt.Errorf("template %q: %w", idOrName, errdefs.ErrNotFound)
	}
	t, err := s.lookup(ctx, name, tag)
	if errors.Is(err, errdefs.ErrNotFound) && !strings.Contains(idOrName, ":") {
		if rows, lerr := s.cfg.Store.ListTemplateTags(ctx, name); lerr == nil && len(rows) > 0 {
			t, err = tagged{Target: rows[0].Target, BuildID: rows[0].BuildID}, nil
		}
	}
	if err != nil {
		return TemplateInfo{}, err
	}
	info, err := s.cfg.Templates.Get(ctx, t.Target)
	if err != nil {
		return TemplateInfo{}, err
	}
	info.Name = name
	return info, nil
}

// Tag is one entry of GET /templates/{templateID}/tags.
type Tag struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time
}

// Tags lists a template's tags (tags.go), sorted; a template without tag
// rows has the default tag, pointing at itself.
func (s *Service) Tags(ctx context.Context, templateID string) ([]Tag, error) {
	name, err := ParseName(templateID)
	if err != nil {
		return nil, fmt.Errorf("template %q: %w", templateID, errdefs.ErrNotFound)
	}
	rows, err := s.cfg.Store.ListTemplateTags(ctx, name)
	if err != nil {
		return nil, err
	}
	out := make([]Tag, 0, len(rows)+1)
	hasDefault := false
	for _, r := range rows {
		out = append(out, Tag{Tag: r.Tag, BuildID: r.BuildID, CreatedAt: r.CreatedAt})
		hasDefault = hasDefault || r.Tag == DefaultTag
	}
	if !hasDefault {
		t, err := s.cfg.Templates.Get(ctx, name)
		switch {
		case err == nil:
			id, err := s.lastReadyBuild(ctx, name)
			if err != nil {
				return nil, err
			}
			out = append(out, Tag{Tag: DefaultTag, BuildID: id, CreatedAt: t.CreatedAt})
		case !errors.Is(err, errdefs.ErrNotFound):
			return nil, err
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	return out, nil
}

// Delete removes a template with all its tags, the per-build templates of
// its builds, and its build records. A name:tag other than the default
// is refused: that deletes one tag, with RemoveTags. It refuses
// (ErrConflict) while a sandbox (running or paused, build sandboxes
// included) uses one of these templates or while a build of it runs: a
// template's rootfs is the lower layer of its sandboxes' overlays and
// deleting it would pull the files from under them.
func (s *Service) Delete(ctx context.Context, idOrName string) error {
	name, tag, err := ParseRef(idOrName)
	if err != nil {
		return fmt.Errorf("template %q: %w", idOrName, errdefs.ErrNotFound)
	}
	if tag != DefaultTag {
		return fmt.Errorf("%w: DELETE /templates/%s: a template is deleted whole, with all its tags (DELETE /templates/%s); remove one tag with Template.removeTags",
			errdefs.ErrInvalidArgument, idOrName, name)
	}
	builds, err := s.cfg.Store.ListTemplateBuilds(ctx, name)
	if err != nil {
		return err
	}
	for _, b := range builds {
		if !b.Status.Terminal() {
			return fmt.Errorf("%w: template %q has a build in progress (%s); wait for it to finish", errdefs.ErrConflict, name, b.ID)
		}
	}
	rows, err := s.cfg.Store.ListTemplateTags(ctx, name)
	if err != nil {
		return err
	}
	targets := []string{name}
	for _, r := range rows {
		if IsBuildTemplate(r.Target) && !slices.Contains(targets, r.Target) {
			targets = append(targets, r.Target)
		}
	}
	for _, b := range builds { // untagged ones the collector has not removed yet
		if t := BuildTemplate(b.ID); !slices.Contains(targets, t) {
			targets = append(targets, t)
		}
	}
	for _, t := range targets {
		if err := s.inUse(ctx, t, "delete it"); err != nil {
			return err
		}
	}
	found := len(builds) > 0 || len(rows) > 0
	for _, t := range targets {
		err := s.cfg.Templates.Delete(ctx, t)
		switch {
		case err == nil:
			found = true
		case !errors.Is(err, errdefs.ErrNotFound):
			return err
		}
	}
	if !found {
		return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	if err := s.cfg.Store.DeleteTemplateTags(ctx, name); err != nil {
		return err
	}
	return s.cfg.Store.DeleteTemplateBuilds(ctx, name)
}

// inUse refuses (ErrConflict, naming them) when sandboxes, running or
// paused, use template name: its rootfs is their overlay's lower layer, so
// it must not be deleted or replaced under them. what says what is refused.
func (s *Service) inUse(ctx context.Context, name, what string) error {
	page, err := s.cfg.Store.ListSandboxes(ctx, store.ListFilter{Template: name, Limit: 6})
	if err != nil {
		return err
	}
	n := len(page.Sandboxes)
	if n == 0 {
		return nil
	}
	ids := make([]string, 0, 5)
	for _, sb := range page.Sandboxes[:min(n, 5)] {
		ids = append(ids, sb.ID)
	}
	more := ""
	if n > 5 || page.NextToken != "" {
		more = " and more"
	}
	return fmt.Errorf("%w: template %q is used by sandboxes %s%s; kill them (DELETE /sandboxes/{id}) before you %s",
		errdefs.ErrConflict, name, strings.Join(ids, ", "), more, what)
}
