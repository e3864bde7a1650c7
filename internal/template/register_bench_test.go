package template_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cube-dev/cube/internal/rootfstest"
	"github.com/cube-dev/cube/internal/template"
)

// BenchmarkRegisterLayered measures a commit of a child of base as the
// cubelet's Commit makes it (LinkTree of the parent plus a 4 MiB change),
// registered with Meta.Parent: Register also walks both trees to store the
// difference as the child's layer, and digests that layer.
func BenchmarkRegisterLayered(b *testing.B) { benchRegister(b, true) }

// BenchmarkRegisterFlat is BenchmarkRegisterLayered without Meta.Parent: a
// flat template, as commits were registered before layers.
func BenchmarkRegisterFlat(b *testing.B) { benchRegister(b, false) }

func benchRegister(b *testing.B, layered bool) {
	ctx := context.Background()
	reg := &template.Registry{Dir: filepath.Join(b.TempDir(), "templates"), CacheDir: b.TempDir()}
	parent, what := rootfstest.Base(b, reg)
	b.Logf("parent: %s", what)
	meta := template.Meta{CPUCount: 2, MemoryMB: 256}
	if layered {
		meta.Parent = &parent
	}
	fill := func(ctx context.Context, rootfs string) error {
		if err := template.LinkTree(ctx, parent.RootfsPath, rootfs); err != nil {
			return err
		}
		rootfstest.Change(b, rootfs)
		return nil
	}
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("child%d", i)
		t, err := reg.Register(ctx, name, meta, fill)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if want := len(parent.LayerChain()) + 1; layered && len(t.Layers) != want {
			b.Fatalf("layers %+v, want %d", t.Layers, want)
		}
		if !layered && len(t.Layers) != 0 {
			b.Fatalf("flat commit has layers %+v", t.Layers)
		}
		if err := reg.Delete(ctx, name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
