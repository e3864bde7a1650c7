package store

import (
	"context"
	"fmt"
)

// NodeData is what the nodes table holds for one node: the registration
// document and the drain progress document. The cluster package owns both
// shapes; the store only keeps them.
type NodeData struct {
	Data     []byte
	Progress []byte // nil when none was written
}

// PutNodeData stores a node's registration document (insert or replace).
// The progress document is left as it is.
func (s *sqlStore) PutNodeData(ctx context.Context, id string, data []byte) error {
	_, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO nodes (id, data, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET data = excluded.data, updated_at = excluded.updated_at`),
		id, string(data), toNanos(s.now()))
	if err != nil {
		return fmt.Errorf("put node %s: %w", id, err)
	}
	return nil
}

// SetNodeProgress replaces a node's progress document alone; ErrNotFound
// if the node is unknown.
func (s *sqlStore) SetNodeProgress(ctx context.Context, id string, progress []byte) error {
	return s.execOne(ctx, "set progress of node "+id, `UPDATE nodes SET progress = ? WHERE id = ?`, string(progress), id)
}

// DeleteNodeData removes a node's documents; ErrNotFound if unknown.
func (s *sqlStore) DeleteNodeData(ctx context.Context, id string) error {
	return s.execOne(ctx, "delete node "+id, `DELETE FROM nodes WHERE id = ?`, id)
}

// ListNodeData returns every node's documents by id, in one query.
func (s *sqlStore) ListNodeData(ctx context.Context) (map[string]NodeData, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, data, progress FROM nodes`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	out := map[string]NodeData{}
	for rows.Next() {
		var id, data, progress string
		if err := rows.Scan(&id, &data, &progress); err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		nd := NodeData{Data: []byte(data)}
		if progress != "" {
			nd.Progress = []byte(progress)
		}
		out[id] = nd
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}
