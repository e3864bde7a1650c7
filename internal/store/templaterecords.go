package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// LayerRef names one layer of a template's stack as the store keeps it
// (the same fields as template.LayerRef; the store does not import
// internal/template).
type LayerRef struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size,omitempty"`
}

// TemplateRecord is a template the control plane can ship to any node: a
// layered template committed on a node whose top layer the server has
// stored (PutLayer). Name is unique.
type TemplateRecord struct {
	Name string
	// Digest is the template's rootfs digest.
	Digest string
	// Layers is the full stack, bottom first; Layers[0] is a flat
	// template's digest.
	Layers []LayerRef
	// BaseName names the flat template whose digest is Layers[0] (e.g.
	// "base"), for nodes that lack it.
	BaseName                       string
	CPUCount, MemoryMB, DiskSizeMB int
	// Defaults is template.Defaults as JSON; nil for none.
	Defaults json.RawMessage
	// Node is the node that built the template.
	Node      string
	CreatedAt time.Time
}

// recordSelect reads records with their layers in one statement (so a
// record replaced meanwhile is never seen half old, half new): one row per
// layer, or one row with NULL layer columns for a record without layers.
const recordSelect = `SELECT t.name, t.digest, t.base_name, t.cpu_count, t.memory_mb, t.disk_size_mb, t.defaults, t.node, t.created_at, l.digest, l.size
	FROM template_records t LEFT JOIN template_record_layers l ON l.template = t.name`

// scanRecords folds the rows of recordSelect (ordered by name, then
// layer seq) into records; never nil.
func scanRecords(rows *timedRows) ([]TemplateRecord, error) {
	out := []TemplateRecord{}
	for rows.Next() {
		var (
			rec       TemplateRecord
			defaults  sql.NullString
			created   int64
			layer     sql.NullString
			layerSize sql.NullInt64
		)
		if err := rows.Scan(&rec.Name, &rec.Digest, &rec.BaseName, &rec.CPUCount, &rec.MemoryMB, &rec.DiskSizeMB,
			&defaults, &rec.Node, &created, &layer, &layerSize); err != nil {
			return nil, err
		}
		if n := len(out); n == 0 || out[n-1].Name != rec.Name {
			if defaults.Valid && defaults.String != "" {
				rec.Defaults = json.RawMessage(defaults.String)
			}
			rec.CreatedAt = fromNanos(created)
			out = append(out, rec)
		}
		if layer.Valid {
			last := &out[len(out)-1]
			last.Layers = append(last.Layers, LayerRef{Digest: layer.String, Size: layerSize.Int64})
		}
	}
	return out, rows.Err()
}

// PutTemplateRecord inserts rec, or replaces the record of that name
// (layers included), in one transaction. A zero CreatedAt is now. The
// stored layers it names are marked used now, so DeleteUnusedLayers running
// at the same time spares them; layers it names need not be stored (the
// bottom one is normally a flat template every node can get by name).
func (s *sqlStore) PutTemplateRecord(ctx context.Context, rec TemplateRecord) (err error) {
	if rec.Name == "" || rec.Digest == "" {
		return fmt.Errorf("put template record: %w: name and digest are required", errdefs.ErrInvalidArgument)
	}
	for i, l := range rec.Layers {
		if l.Digest == "" {
			return fmt.Errorf("put template record %s: %w: layer %d has no digest", rec.Name, errdefs.ErrInvalidArgument, i)
		}
	}
	if rec.Defaults != nil && !json.Valid(rec.Defaults) {
		return fmt.Errorf("put template record %s: %w: defaults are not JSON", rec.Name, errdefs.ErrInvalidArgument)
	}
	created := rec.CreatedAt
	if created.IsZero() {
		created = s.now()
	}
	var defaults sql.NullString
	if len(rec.Defaults) > 0 {
		defaults = sql.NullString{String: string(rec.Defaults), Valid: true}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("put template record %s: %w", rec.Name, err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO template_records (name, digest, base_name, cpu_count, memory_mb, disk_size_mb, defaults, node, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET digest = excluded.digest, base_name = excluded.base_name, cpu_count = excluded.cpu_count,
			memory_mb = excluded.memory_mb, disk_size_mb = excluded.disk_size_mb, defaults = excluded.defaults, node = excluded.node,
			created_at = excluded.created_at`),
		rec.Name, rec.Digest, rec.BaseName, rec.CPUCount, rec.MemoryMB, rec.DiskSizeMB, defaults, rec.Node, toNanos(created)); err != nil {
		return fmt.Errorf("put template record %s: %w", rec.Name, err)
	}
	if _, err := tx.ExecContext(ctx, s.d.bind(`DELETE FROM template_record_layers WHERE template = ?`), rec.Name); err != nil {
		return fmt.Errorf("put template record %s: %w", rec.Name, err)
	}
	now := toNanos(s.now())
	for i, l := range rec.Layers {
		if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO template_record_layers (template, seq, digest, size) VALUES (?, ?, ?, ?)`),
			rec.Name, i, l.Digest, l.Size); err != nil {
			return fmt.Errorf("put template record %s: layer %d: %w", rec.Name, i, err)
		}
		// On PostgreSQL this also locks the layer row until commit, so a
		// concurrent DeleteUnusedLayers re-checks used_at and keeps it.
		if _, err := tx.ExecContext(ctx, s.d.bind(`UPDATE layers SET used_at = ? WHERE digest = ?`), now, l.Digest); err != nil {
			return fmt.Errorf("put template record %s: layer %d: %w", rec.Name, i, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("put template record %s: %w", rec.Name, err)
	}
	return nil
}

// GetTemplateRecord returns the record name; ErrNotFound if there is none.
func (s *sqlStore) GetTemplateRecord(ctx context.Context, name string) (TemplateRecord, error) {
	recs, err := s.queryRecords(ctx, "get template record "+name, recordSelect+` WHERE t.name = ? ORDER BY l.seq`, name)
	if err != nil {
		return TemplateRecord{}, err
	}
	if len(recs) == 0 {
		return TemplateRecord{}, fmt.Errorf("template record %s: %w", name, errdefs.ErrNotFound)
	}
	return recs[0], nil
}

// ListTemplateRecords returns every record, sorted by name; never nil.
func (s *sqlStore) ListTemplateRecords(ctx context.Context) ([]TemplateRecord, error) {
	return s.queryRecords(ctx, "list template records", recordSelect+` ORDER BY t.name, l.seq`)
}

func (s *sqlStore) queryRecords(ctx context.Context, what, query string, args ...any) ([]TemplateRecord, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(query), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	recs, err := scanRecords(rows)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return recs, nil
}

// DeleteTemplateRecord removes the record name and its layer list (not the
// layers: DeleteUnusedLayers collects those no record references);
// ErrNotFound if there is none.
func (s *sqlStore) DeleteTemplateRecord(ctx context.Context, name string) error {
	return s.execOne(ctx, "delete template record "+name, `DELETE FROM template_records WHERE name = ?`, name)
}
