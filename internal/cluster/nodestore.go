package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
)

// DocumentStore keeps one JSON document per node (the server's SQL store).
type DocumentStore interface {
	PutNodeData(ctx context.Context, id string, data []byte) error
	DeleteNodeData(ctx context.Context, id string) error
	ListNodeData(ctx context.Context) (map[string][]byte, error)
}

// DocumentNodes adapts a DocumentStore to NodeStore, owning the encoding of
// NodeRecord.
type DocumentNodes struct{ Docs DocumentStore }

var _ NodeStore = DocumentNodes{}

// PutNode stores a node record.
func (d DocumentNodes) PutNode(ctx context.Context, n NodeRecord) error {
	data, err := json.Marshal(n)
	if err != nil {
		return err
	}
	return d.Docs.PutNodeData(ctx, n.ID, data)
}

// DeleteNode removes a node record.
func (d DocumentNodes) DeleteNode(ctx context.Context, id string) error {
	return d.Docs.DeleteNodeData(ctx, id)
}

// ListNodes returns every node record, sorted by id. A record that cannot
// be decoded fails the listing: the operator must see it, not lose a node.
func (d DocumentNodes) ListNodes(ctx context.Context) ([]NodeRecord, error) {
	docs, err := d.Docs.ListNodeData(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]NodeRecord, 0, len(docs))
	for id, data := range docs {
		var n NodeRecord
		if err := json.Unmarshal(data, &n); err != nil || n.ID != id {
			return nil, fmt.Errorf("node record %s is unreadable (%v): fix or delete it in the nodes table", id, err)
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
