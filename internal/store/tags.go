package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// TemplateTag is one tag of a template: template:tag names the result of
// build BuildID, kept as the registry template Target (internal/templatebuild
// owns the semantics; the store keeps the record).
type TemplateTag struct {
	Template string
	Tag      string
	// BuildID is empty for a tag of a template that was not built through
	// the template API.
	BuildID   string
	Target    string
	CreatedAt time.Time
}

func isNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

const tagColumns = `template, tag, build_id, target, created_at`

func scanTag(r rowScanner) (TemplateTag, error) {
	var (
		t       TemplateTag
		created int64
	)
	if err := r.Scan(&t.Template, &t.Tag, &t.BuildID, &t.Target, &created); err != nil {
		return TemplateTag{}, err
	}
	t.CreatedAt = fromNanos(created)
	return t, nil
}

// SetTemplateBuildTags records the tags build buildID gets when it is
// ready, in order; it replaces earlier ones.
func (s *sqlStore) SetTemplateBuildTags(ctx context.Context, buildID string, tags []string) (err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("set tags of template build %s: %w", buildID, err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, s.d.bind(`DELETE FROM template_build_tags WHERE build_id = ?`), buildID); err != nil {
		return fmt.Errorf("set tags of template build %s: %w", buildID, err)
	}
	for i, tag := range tags {
		if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO template_build_tags (build_id, tag, seq) VALUES (?, ?, ?)
			ON CONFLICT (build_id, tag) DO NOTHING`), buildID, tag, i); err != nil {
			return fmt.Errorf("set tags of template build %s: %w", buildID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("set tags of template build %s: %w", buildID, err)
	}
	return nil
}

// TemplateBuildTags returns the tags recorded for build buildID, in order;
// empty (never nil) when none were (builds of an older version).
func (s *sqlStore) TemplateBuildTags(ctx context.Context, buildID string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(`SELECT tag FROM template_build_tags WHERE build_id = ? ORDER BY seq, tag`), buildID)
	if err != nil {
		return nil, fmt.Errorf("tags of template build %s: %w", buildID, err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var tag string
		if err := rows.Scan(&tag); err != nil {
			return nil, fmt.Errorf("tags of template build %s: %w", buildID, err)
		}
		out = append(out, tag)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tags of template build %s: %w", buildID, err)
	}
	return out, nil
}

// GetTemplateTag returns template:tag; ErrNotFound if there is no such tag.
func (s *sqlStore) GetTemplateTag(ctx context.Context, template, tag string) (TemplateTag, error) {
	t, err := scanTag(s.db.QueryRowContext(ctx, s.d.bind(`SELECT `+tagColumns+` FROM template_tags WHERE template = ? AND tag = ?`), template, tag))
	if err != nil {
		if isNoRows(err) {
			return TemplateTag{}, fmt.Errorf("tag %s:%s: %w", template, tag, errdefs.ErrNotFound)
		}
		return TemplateTag{}, fmt.Errorf("get tag %s:%s: %w", template, tag, err)
	}
	return t, nil
}

// ListTemplateTags returns the tags of template (of every template when
// template is empty), sorted by template and tag; never nil.
func (s *sqlStore) ListTemplateTags(ctx context.Context, template string) ([]TemplateTag, error) {
	q, args := `SELECT `+tagColumns+` FROM template_tags`, []any{}
	if template != "" {
		q, args = q+` WHERE template = ?`, append(args, template)
	}
	return s.queryTags(ctx, "list template tags", q+` ORDER BY template, tag`, args...)
}

// TemplateTagsOf returns the tags whose target is the registry template
// target; never nil.
func (s *sqlStore) TemplateTagsOf(ctx context.Context, target string) ([]TemplateTag, error) {
	return s.queryTags(ctx, "list tags of "+target,
		`SELECT `+tagColumns+` FROM template_tags WHERE target = ? ORDER BY template, tag`, target)
}

func (s *sqlStore) queryTags(ctx context.Context, what, query string, args ...any) ([]TemplateTag, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(query), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	out := []TemplateTag{}
	for rows.Next() {
		t, err := scanTag(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// PutTemplateTags points template:tag, for every tag of tags, at buildID
// and target, in one transaction, and returns the rows it replaced (so the
// caller can drop templates no tag points at any more).
func (s *sqlStore) PutTemplateTags(ctx context.Context, template string, tags []string, buildID, target string) (replaced []TemplateTag, err error) {
	if len(tags) == 0 {
		return nil, fmt.Errorf("put tags of %s: %w: no tags", template, errdefs.ErrInvalidArgument)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("put tags of %s: %w", template, err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	now := toNanos(s.now())
	for _, tag := range tags {
		old, err := scanTag(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+tagColumns+` FROM template_tags WHERE template = ? AND tag = ?`), template, tag))
		switch {
		case err == nil:
			if old.Target != target || old.BuildID != buildID {
				replaced = append(replaced, old)
			}
		case !isNoRows(err):
			return nil, fmt.Errorf("put tag %s:%s: %w", template, tag, err)
		}
		if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO template_tags (`+tagColumns+`) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (template, tag) DO UPDATE SET build_id = excluded.build_id, target = excluded.target, created_at = excluded.created_at`),
			template, tag, buildID, target, now); err != nil {
			return nil, fmt.Errorf("put tag %s:%s: %w", template, tag, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("put tags of %s: %w", template, err)
	}
	return replaced, nil
}

// RemoveTemplateTags removes template:tag for every tag of tags and returns
// the removed rows. All or nothing: when one of them does not exist it
// removes none and returns ErrNotFound naming the missing ones.
func (s *sqlStore) RemoveTemplateTags(ctx context.Context, template string, tags []string) (removed []TemplateTag, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("remove tags of %s: %w", template, err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	var missing []string
	for _, tag := range tags {
		old, err := scanTag(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+tagColumns+` FROM template_tags WHERE template = ? AND tag = ?`), template, tag))
		switch {
		case isNoRows(err):
			missing = append(missing, tag)
			continue
		case err != nil:
			return nil, fmt.Errorf("remove tag %s:%s: %w", template, tag, err)
		}
		if _, err := tx.ExecContext(ctx, s.d.bind(`DELETE FROM template_tags WHERE template = ? AND tag = ?`), template, tag); err != nil {
			return nil, fmt.Errorf("remove tag %s:%s: %w", template, tag, err)
		}
		removed = append(removed, old)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("%w: template %q has no tag %s", errdefs.ErrNotFound, template, strings.Join(missing, ", "))
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("remove tags of %s: %w", template, err)
	}
	return removed, nil
}

// DeleteTemplateTags removes every tag of template and the recorded tags
// of its builds (call it before DeleteTemplateBuilds, which removes the
// builds these refer to).
func (s *sqlStore) DeleteTemplateTags(ctx context.Context, template string) error {
	if _, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM template_build_tags WHERE build_id IN (SELECT id FROM template_builds WHERE template = ?)`), template); err != nil {
		return fmt.Errorf("delete tags of template %s: %w", template, err)
	}
	if _, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM template_tags WHERE template = ?`), template); err != nil {
		return fmt.Errorf("delete tags of template %s: %w", template, err)
	}
	return nil
}
