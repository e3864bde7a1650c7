package templatedist

import (
	"context"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/template"
)

var _ cluster.TemplateSource = Source{}

// Source tells the scheduler which templates the server can ship: those in
// its own registry (usually <server data-dir>/templates), read per call.
type Source struct {
	Registry *template.Registry
}

// ServerTemplate returns the server's template called name, or an error
// wrapping errdefs.ErrNotFound when the server lacks it.
func (s Source) ServerTemplate(ctx context.Context, name string) (cluster.TemplateRef, error) {
	t, err := s.Registry.Get(ctx, name)
	if err != nil {
		return cluster.TemplateRef{}, err
	}
	return refOf(t), nil
}
