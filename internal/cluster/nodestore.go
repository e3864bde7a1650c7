package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/cube-dev/cube/internal/store"
)

// DocumentStore keeps one JSON document per node, plus its drain progress
// apart (the server's SQL store).
type DocumentStore interface {
	PutNodeData(ctx context.Context, id string, data []byte) error
	SetNodeProgress(ctx context.Context, id string, progress []byte) error
	DeleteNodeData(ctx context.Context, id string) error
	ListNodeData(ctx context.Context) (map[string]store.NodeData, error)
}

// DocumentNodes adapts a DocumentStore to NodeStore, owning the encoding of
// NodeRecord and DrainProgress.
type DocumentNodes struct{ Docs DocumentStore }

var _ NodeStore = DocumentNodes{}

// PutNode stores a node record (its Progress is not part of it).
func (d DocumentNodes) PutNode(ctx context.Context, n NodeRecord) error {
	data, err := json.Marshal(n)
	if err != nil {
		return err
	}
	return d.Docs.PutNodeData(ctx, n.ID, data)
}

// SetDrainProgress stores a node's drain progress alone.
func (d DocumentNodes) SetDrainProgress(ctx context.Context, id string, p DrainProgress) error {
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return d.Docs.SetNodeProgress(ctx, id, data)
}

// DeleteNode removes a node record.
func (d DocumentNodes) DeleteNode(ctx context.Context, id string) error {
	return d.Docs.DeleteNodeData(ctx, id)
}

// ListNodes returns every node record with its progress, sorted by id, in
// one query. A record that cannot be decoded fails the listing: the
// operator must see it, not lose a node.
func (d DocumentNodes) ListNodes(ctx context.Context) ([]NodeRecord, error) {
	docs, err := d.Docs.ListNodeData(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]NodeRecord, 0, len(docs))
	for id, doc := range docs {
		var n NodeRecord
		if err := json.Unmarshal(doc.Data, &n); err != nil || n.ID != id {
			return nil, fmt.Errorf("node record %s is unreadable (%v): fix or delete it in the nodes table", id, err)
		}
		if doc.Progress != nil {
			var p DrainProgress
			if err := json.Unmarshal(doc.Progress, &p); err != nil {
				return nil, fmt.Errorf("drain progress of node %s is unreadable (%v): fix or empty the progress column of the nodes table", id, err)
			}
			n.Progress = &p
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
