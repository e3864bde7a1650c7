package templatebuild

// Template tags, as E2B's SDK uses them: `name:tag` names one build of
// template name; `name` is `name:default`. A store row points name:tag at
// a build and at the registry template holding that build's result (its
// target). A build commits into the template's own name when it gets the
// default tag and no other tag needs what that template holds; otherwise
// into a per-build template, BuildTemplate(buildID), hidden from listings.
// So every tagged build stays addressable however often the template is
// rebuilt. A template made without the template API (base, `cube template
// create`, builds of older versions) has no rows: its default tag is the
// template itself.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

// TagStore is the part of the control-plane store tags use
// (internal/store/tags.go).
type TagStore interface {
	SetTemplateBuildTags(ctx context.Context, buildID string, tags []string) error
	TemplateBuildTags(ctx context.Context, buildID string) ([]string, error)
	GetTemplateTag(ctx context.Context, template, tag string) (store.TemplateTag, error)
	ListTemplateTags(ctx context.Context, template string) ([]store.TemplateTag, error)
	TemplateTagsOf(ctx context.Context, target string) ([]store.TemplateTag, error)
	PutTemplateTags(ctx context.Context, template string, tags []string, buildID, target string) ([]store.TemplateTag, error)
	RemoveTemplateTags(ctx context.Context, template string, tags []string) ([]store.TemplateTag, error)
	DeleteTemplateTags(ctx context.Context, template string) error
}

// tagged is what name:tag resolves to.
type tagged struct {
	Target  string // the registry template
	BuildID string // "" for a template not built through the API
}

// lookup resolves name:tag: the tag's row; for the default tag without a
// row, the template name itself when it exists.
func (s *Service) lookup(ctx context.Context, name, tag string) (tagged, error) {
	row, err := s.cfg.Store.GetTemplateTag(ctx, name, tag)
	if err == nil {
		return tagged{Target: row.Target, BuildID: row.BuildID}, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return tagged{}, err
	}
	if tag == DefaultTag {
		_, err := s.cfg.Templates.Get(ctx, name)
		if err == nil {
			id, err := s.lastReadyBuild(ctx, name)
			return tagged{Target: name, BuildID: id}, err
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return tagged{}, err
		}
	}
	return tagged{}, s.noTag(ctx, name, tag)
}

// noTag is the ErrNotFound of an unknown name:tag, naming the tags the
// template has.
func (s *Service) noTag(ctx context.Context, name, tag string) error {
	tags, err := s.Tags(ctx, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("%w: template %q not found; list templates with GET /templates", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return err
	}
	names := make([]string, 0, len(tags))
	for _, t := range tags {
		names = append(names, t.Tag)
	}
	return fmt.Errorf("%w: template %q has no tag %q (its tags: %s); build %s:%s or point the tag at a build with Template.assignTags",
		errdefs.ErrNotFound, name, tag, strings.Join(names, ", "), name, tag)
}

// lastReadyBuild returns the id of the template's last ready build, ""
// when it has none.
func (s *Service) lastReadyBuild(ctx context.Context, name string) (string, error) {
	builds, err := s.cfg.Store.ListTemplateBuilds(ctx, name)
	if err != nil {
		return "", err
	}
	for i := len(builds) - 1; i >= 0; i-- {
		if builds[i].Status == store.BuildReady {
			return builds[i].ID, nil
		}
	}
	return "", nil
}

// ResolveTemplate returns the registry template a sandbox of ref (a
// template id, name or name:tag) is created from: the template its tag
// points at. A ref that is no E2B name, or a name without tags, comes back
// as it is (lowercased) for the node to look up; an unknown tag is
// ErrNotFound.
func (s *Service) ResolveTemplate(ctx context.Context, ref string) (string, error) {
	name, tag, err := ParseRef(ref)
	if err != nil {
		return ref, nil
	}
	row, err := s.cfg.Store.GetTemplateTag(ctx, name, tag)
	switch {
	case err == nil:
		return row.Target, nil
	case !errors.Is(err, errdefs.ErrNotFound):
		return "", err
	case tag != DefaultTag:
		return "", s.noTag(ctx, name, tag)
	}
	if _, err := s.cfg.Templates.Get(ctx, name); errors.Is(err, errdefs.ErrNotFound) {
		if tags, err := s.cfg.Store.ListTemplateTags(ctx, name); err == nil && len(tags) > 0 {
			return "", s.noTag(ctx, name, tag)
		}
	}
	return name, nil
}

// resolveParent resolves a build's fromTemplate (name or name:tag) to the
// registry template it names.
func (s *Service) resolveParent(ctx context.Context, p Parent) (Parent, error) {
	if p.Image != "" {
		return p, nil
	}
	name, tag, err := ParseRef(p.Template)
	if err != nil {
		return p, err
	}
	t, err := s.lookup(ctx, name, tag)
	if errors.Is(err, errdefs.ErrNotFound) && tag == DefaultTag {
		return Parent{Template: name}, nil // checkParent says it does not exist
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return p, fmt.Errorf("%w: the template to build from: %w", errdefs.ErrInvalidArgument, err)
		}
		return p, err
	}
	return Parent{Template: t.Target}, nil
}

// buildTags returns the tags build buildID gets when it is ready.
func (s *Service) buildTags(ctx context.Context, buildID string) ([]string, error) {
	tags, err := s.cfg.Store.TemplateBuildTags(ctx, buildID)
	if err != nil {
		return nil, err
	}
	if len(tags) == 0 {
		tags = []string{DefaultTag} // requested before tags existed
	}
	return tags, nil
}

// commitTarget chooses the template the final commit of build buildID
// writes: the template's own name when the build gets the default tag, is
// not built from that template itself, and no other tag needs what the
// template holds now; else BuildTemplate(buildID). Replacing the own name
// is refused while sandboxes use it, as before tags.
func (s *Service) commitTarget(ctx context.Context, buildID, parent string) (string, error) {
	b, err := s.cfg.Store.GetTemplateBuild(ctx, buildID)
	if err != nil {
		return "", err
	}
	tags, err := s.buildTags(ctx, buildID)
	if err != nil {
		return "", err
	}
	if !slices.Contains(tags, DefaultTag) || parent == b.Template {
		return BuildTemplate(buildID), nil
	}
	rows, err := s.cfg.Store.TemplateTagsOf(ctx, b.Template)
	if err != nil {
		return "", err
	}
	for _, r := range rows {
		if r.Template != b.Template || !slices.Contains(tags, r.Tag) {
			return BuildTemplate(buildID), nil // r keeps needing it
		}
	}
	return b.Template, s.inUse(ctx, b.Template, "rebuild it")
}

// tagBuild points the tags of build buildID at target, the template its
// final commit wrote, and drops the per-build templates no tag points at
// any more.
func (s *Service) tagBuild(ctx context.Context, buildID, target string) error {
	b, err := s.cfg.Store.GetTemplateBuild(ctx, buildID)
	if err != nil {
		return err
	}
	tags, err := s.buildTags(ctx, buildID)
	if err != nil {
		return err
	}
	replaced, err := s.cfg.Store.PutTemplateTags(ctx, b.Template, tags, buildID, target)
	if err != nil {
		return err
	}
	s.dropUntagged(ctx, replaced)
	return nil
}

// AssignedTags answers AssignTags.
type AssignedTags struct {
	BuildID string
	Tags    []string
}

// AssignTags points tags of target's template at the build target
// (name:tag, or name for its default tag) names; tags move from the builds
// they named before.
func (s *Service) AssignTags(ctx context.Context, target string, tags []string) (AssignedTags, error) {
	name, tag, err := ParseRef(target)
	if err != nil {
		return AssignedTags{}, err
	}
	if tags, err = normTags(tags); err != nil {
		return AssignedTags{}, err
	}
	if len(tags) == 0 {
		return AssignedTags{}, fmt.Errorf("%w: at least one tag is required", errdefs.ErrInvalidArgument)
	}
	src, err := s.lookup(ctx, name, tag)
	if err != nil {
		return AssignedTags{}, err
	}
	replaced, err := s.cfg.Store.PutTemplateTags(ctx, name, tags, src.BuildID, src.Target)
	if err != nil {
		return AssignedTags{}, err
	}
	s.dropUntagged(ctx, replaced)
	return AssignedTags{BuildID: src.BuildID, Tags: tags}, nil
}

// RemoveTags removes tags from template name (given without a tag). The
// default tag cannot be removed: point it elsewhere with AssignTags, or
// delete the template. All or nothing: an unknown tag is ErrNotFound.
func (s *Service) RemoveTags(ctx context.Context, name string, tags []string) error {
	n, _, err := ParseRef(name)
	if err != nil {
		return err
	}
	if strings.Contains(name, ":") {
		return fmt.Errorf("%w: template name %q should not contain a tag; give the tags to remove in tags", errdefs.ErrInvalidArgument, name)
	}
	if tags, err = normTags(tags); err != nil {
		return err
	}
	if len(tags) == 0 {
		return fmt.Errorf("%w: at least one tag is required", errdefs.ErrInvalidArgument)
	}
	if slices.Contains(tags, DefaultTag) {
		return fmt.Errorf("%w: the tag %q cannot be removed; point it at another build with Template.assignTags, or delete the template",
			errdefs.ErrInvalidArgument, DefaultTag)
	}
	if _, err := s.Tags(ctx, n); err != nil {
		return err
	}
	removed, err := s.cfg.Store.RemoveTemplateTags(ctx, n, tags)
	if err != nil {
		return err
	}
	s.dropUntagged(ctx, removed)
	return nil
}

// dropUntagged deletes the per-build templates of rows that no tag points
// at any more and no sandbox uses. Failures are logged: CollectLeftovers
// retries them.
func (s *Service) dropUntagged(ctx context.Context, rows []store.TemplateTag) {
	seen := map[string]bool{}
	for _, r := range rows {
		if !IsBuildTemplate(r.Target) || seen[r.Target] {
			continue
		}
		seen[r.Target] = true
		if _, err := s.dropIfUntagged(ctx, r.Target); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			s.log.Warn("delete an untagged build template", "template", r.Target, "err", err)
		}
	}
}

// dropIfUntagged deletes the per-build template name unless a tag points
// at it or a sandbox uses it (ErrConflict); it reports whether it did.
func (s *Service) dropIfUntagged(ctx context.Context, name string) (bool, error) {
	rows, err := s.cfg.Store.TemplateTagsOf(ctx, name)
	if err != nil || len(rows) > 0 {
		return false, err
	}
	if err := s.inUse(ctx, name, "delete it"); err != nil {
		return false, err
	}
	if err := s.cfg.Templates.Delete(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return false, err
	}
	return true, nil
}

// untaggedGrace is how old a per-build template no tag points at must be
// before CollectLeftovers removes it: a build commits it moments before
// its tags point at it (on any replica).
const untaggedGrace = 10 * time.Minute

// collectUntagged removes the per-build templates among tpls that no tag
// points at and no sandbox uses, created more than min(maxAge,
// untaggedGrace) ago: they are unreachable (their tags moved, were
// removed, or a removal right then failed).
func (s *Service) collectUntagged(ctx context.Context, tpls []TemplateInfo, maxAge time.Duration) ([]string, error) {
	cutoff := s.now().Add(-min(maxAge, untaggedGrace))
	var out []string
	var errs []error
	for _, t := range tpls {
		if !IsBuildTemplate(t.Name) || !t.CreatedAt.Before(cutoff) {
			continue
		}
		switch dropped, err := s.dropIfUntagged(ctx, t.Name); {
		case dropped:
			out = append(out, t.Name)
		case err != nil && !errors.Is(err, errdefs.ErrConflict):
			errs = append(errs, fmt.Errorf("delete %s: %w", t.Name, err))
		}
	}
	return out, errors.Join(errs...)
}
