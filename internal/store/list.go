package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// cursor is the position after which the next page starts.
type cursor struct {
	startedAt int64
	id        string
}

// encodeCursor makes the opaque nextToken: base64url("v1:<nanos>:<id>").
func encodeCursor(c cursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte("v1:" + strconv.FormatInt(c.startedAt, 10) + ":" + c.id))
}

// decodeCursor parses a nextToken; ErrInvalidArgument if it is not one of ours.
func decodeCursor(tok string) (cursor, error) {
	bad := fmt.Errorf("%w: invalid nextToken; pass the X-Next-Token value of the previous page", errdefs.ErrInvalidArgument)
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return cursor{}, bad
	}
	rest, ok := strings.CutPrefix(string(raw), "v1:")
	if !ok {
		return cursor{}, bad
	}
	ns, id, ok := strings.Cut(rest, ":")
	if !ok || id == "" {
		return cursor{}, bad
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return cursor{}, bad
	}
	return cursor{startedAt: n, id: id}, nil
}

// ListSandboxes returns one page of sandboxes matching f, ordered by
// (started_at, id) in f.Order (default descending).
func (s *sqlStore) ListSandboxes(ctx context.Context, f ListFilter) (Page, error) {
	limit := f.Limit
	switch {
	case limit < 0:
		return Page{}, fmt.Errorf("list sandboxes: %w: limit must be positive", errdefs.ErrInvalidArgument)
	case limit == 0:
		limit = DefaultLimit
	case limit > MaxLimit:
		limit = MaxLimit
	}
	order := f.Order
	if order == "" {
		order = OrderDesc
	}
	if order != OrderAsc && order != OrderDesc {
		return Page{}, fmt.Errorf("list sandboxes: %w: order must be asc or desc", errdefs.ErrInvalidArgument)
	}

	var (
		where []string
		args  []any
	)
	for k, v := range f.Metadata {
		where = append(where, `EXISTS (SELECT 1 FROM sandbox_metadata m WHERE m.sandbox_id = s.id AND m.key = ? AND m.value = ?)`)
		args = append(args, k, v)
	}
	if len(f.States) > 0 {
		ph := make([]string, len(f.States))
		for i, st := range f.States {
			if !st.Valid() {
				return Page{}, fmt.Errorf("list sandboxes: %w: unknown state %q (want running or paused)", errdefs.ErrInvalidArgument, st)
			}
			ph[i] = "?"
			args = append(args, string(st))
		}
		where = append(where, `s.state IN (`+strings.Join(ph, ", ")+`)`)
	}
	if !f.StartedAfter.IsZero() {
		where = append(where, `s.started_at >= ?`)
		args = append(args, toNanos(f.StartedAfter))
	}
	switch {
	case f.Template != "" && f.AnyTag:
		// A prefix test, not LIKE: '_' (in template names) is a LIKE wildcard.
		where = append(where, `(s.template_id = ? OR s.alias = ? OR lower(substr(s.alias, 1, length(?) + 1)) = ? || ':')`)
		args = append(args, f.Template, f.Template, f.Template, f.Template)
	case f.Template != "":
		where = append(where, `(s.template_id = ? OR s.alias = ?)`)
		args = append(args, f.Template, f.Template)
	}
	if f.NextToken != "" {
		c, err := decodeCursor(f.NextToken)
		if err != nil {
			return Page{}, fmt.Errorf("list sandboxes: %w", err)
		}
		cmp := "<"
		if order == OrderAsc {
			cmp = ">"
		}
		where = append(where, `(s.started_at `+cmp+` ? OR (s.started_at = ? AND s.id `+cmp+` ?))`)
		args = append(args, c.startedAt, c.startedAt, c.id)
	}
	q := `SELECT ` + prefixed("s.", sandboxColumns) + ` FROM sandboxes s`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	dir := "DESC"
	if order == OrderAsc {
		dir = "ASC"
	}
	q += ` ORDER BY s.started_at ` + dir + `, s.id ` + dir + ` LIMIT ?`
	args = append(args, limit+1)

	sbs, err := s.query(ctx, "list sandboxes", q, args...)
	if err != nil {
		return Page{}, err
	}
	page := Page{Sandboxes: sbs}
	if len(sbs) > limit {
		page.Sandboxes = sbs[:limit]
		last := sbs[limit-1]
		page.NextToken = encodeCursor(cursor{startedAt: toNanos(last.StartedAt), id: last.ID})
	}
	return page, nil
}

// prefixed qualifies each column of a comma-separated list with p.
func prefixed(p, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = p + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
