package cluster

import (
	"context"
	"slices"
)

// supply says how nodes that lack a template can get it from the server.
type supply struct {
	// server: the server ships the template (whole, from its registry, or
	// as layers from the store).
	server bool
	// layers is the template's layer stack (digests, bottom first) when
	// the server ships it as layers: a node makes it from a template it
	// holds plus the layers above.
	layers []string
	// baseOnServer: the server also ships the template of the bottom
	// layer, so a node holding none of the stack can still make it.
	baseOnServer bool
}

// fetchableBy reports whether a node holding held leading layers of the
// template can get the rest.
func (s supply) fetchableBy(held int) bool {
	if !s.server {
		return false
	}
	return len(s.layers) < 2 || held > 0 || s.baseOnServer
}

// supplyOf is how the server supplies its template t.
func (r *Registry) supplyOf(ctx context.Context, t TemplateRef) supply {
	sup := supply{server: true}
	if len(t.Layers) < 2 {
		return sup
	}
	sup.layers = t.Layers
	if t.Base != "" {
		if b, err := r.serverTemplate(ctx, t.Base); err == nil && slices.Equal(b.chain(), t.Layers[:1]) {
			sup.baseOnServer = true
		}
	}
	return sup
}

// heldLayers is how many leading layers of stack the node holding refs
// has: the longest layer stack of its templates that is a prefix of
// stack (a flat template is its digest alone).
func heldLayers(refs []TemplateRef, stack []string) int {
	best := 0
	for _, t := range refs {
		c := t.chain()
		if len(c) > best && len(c) <= len(stack) && slices.Equal(c, stack[:len(c)]) {
			best = len(c)
		}
	}
	return best
}
