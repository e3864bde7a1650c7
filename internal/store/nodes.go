package store

import (
	"context"
	"fmt"
)

// PutNodeData stores a node's registration document (insert or replace).
// The cluster package owns the document's shape.
func (s *sqlStore) PutNodeData(ctx context.Context, id string, data []byte) error {
	_, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO nodes (id, data, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at`),
		id, string(data), toNanos(s.now()))
	if err != nil {
		return fmt.Errorf("put node %s: %w", id, err)
	}
	return nil
}

// DeleteNodeData removes a node's document; ErrNotFound if unknown.
func (s *sqlStore) DeleteNodeData(ctx context.Context, id string) error {
	return s.execOne(ctx, "delete node "+id, `DELETE FROM nodes WHERE id = ?`, id)
}

// ListNodeData returns every node's document by id.
func (s *sqlStore) ListNodeData(ctx context.Context) (map[string][]byte, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, data FROM nodes`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	out := map[string][]byte{}
	for rows.Next() {
		var id, data string
		if err := rows.Scan(&id, &data); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		out[id] = []byte(data)
	}
	return out, rows.Err()
}
