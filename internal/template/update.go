package template

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/cube-dev/cube/internal/atomicfile"
)

// UpdateDefaults applies update to the Defaults of the registered template
// called name (a zero Defaults when it has none) and rewrites its
// template.json atomically. The digest covers the rootfs only, so it is
// unchanged; sandboxes created afterwards see the new defaults.
func (r *Registry) UpdateDefaults(ctx context.Context, name string, update func(*Defaults)) (Template, error) {
	if err := ValidateName(name); err != nil {
		return Template{}, err
	}
	unlock, err := r.lock(ctx, name)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	t, err := r.load(name)
	if err != nil {
		return Template{}, err
	}
	d := Defaults{}
	if t.Defaults != nil {
		d = *t.Defaults
	}
	update(&d)
	t.Defaults = &d
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return Template{}, fmt.Errorf("encode metadata: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(r.Dir, name, metaFile), append(b, '\n'), 0o644); err != nil {
		return Template{}, fmt.Errorf("update metadata of template %q: %w", name, err)
	}
	return t, nil
}
