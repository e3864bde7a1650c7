package template

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// TestImportLayersRefuses: a layer whose digest is not its ref's
// (ErrConflict), a tar with ../ or a path through an absolute symlink
// (ErrInvalidArgument, nothing written outside the staging dir), a final
// digest that is not the published one (ErrConflict), refs that do not
// extend lower's chain (ErrInvalidArgument, nothing opened): each leaves
// nothing registered and nothing staged.
func TestImportLayersRefuses(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	parent, child := registerParentChild(t, ctx, r)
	var layerTar bytes.Buffer
	if err := WriteLayerTar(ctx, child.TopLayerDir(), &layerTar); err != nil {
		t.Fatal(err)
	}
	top := child.Layers[1]
	outside := t.TempDir()
	fileTar := func(entries ...tarEntry) []byte {
		b, err := os.ReadFile(writeTarFile(t, false, entries...))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	otherDigest := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		name    string
		tar     []byte
		ref     LayerRef
		digest  string     // published template digest; child's when ""
		layers  []LayerRef // published stack; parent's chain + ref when nil
		want    error
		opensNo bool
	}{
		{name: "digest-mismatch", tar: layerTar.Bytes(), ref: LayerRef{Digest: otherDigest}, want: errdefs.ErrConflict},
		{name: "dotdot", tar: fileTar(reg("../escape", "x", 0o644)), ref: top, want: errdefs.ErrInvalidArgument},
		{name: "abs-symlink", tar: fileTar(symlink("evil", outside), reg("evil/owned", "x", 0o644)), ref: top, want: errdefs.ErrInvalidArgument},
		{name: "final-digest", tar: layerTar.Bytes(), ref: top, digest: otherDigest, want: errdefs.ErrConflict},
		{name: "not-on-lower", tar: layerTar.Bytes(), ref: top, layers: []LayerRef{{Digest: otherDigest}, top},
			want: errdefs.ErrInvalidArgument, opensNo: true},
		{name: "too-long", tar: layerTar.Bytes(), ref: top, layers: []LayerRef{{Digest: parent.Digest}, top, top},
			want: errdefs.ErrInvalidArgument, opensNo: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := Published{Digest: c.digest, Layers: c.layers}
			if p.Digest == "" {
				p.Digest = child.Digest
			}
			if p.Layers == nil {
				p.Layers = []LayerRef{{Digest: parent.Digest}, c.ref}
			}
			opened := 0
			_, err := r.ImportLayers(ctx, "bad", parent, []LayerSource{{Ref: c.ref, Open: countingOpener(c.tar, &opened)}}, p)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if c.opensNo != (opened == 0) {
				t.Fatalf("opened %d times", opened)
			}
			if _, err := r.Get(ctx, "bad"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("registered anyway: %v", err)
			}
			entries, _ := os.ReadDir(r.Dir)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), tmpPrefix) || e.Name() == "bad" {
					t.Errorf("left behind: %s", e.Name())
				}
			}
			if left, _ := os.ReadDir(outside); len(left) != 0 {
				t.Errorf("written outside the staging dir: %v", left)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(r.Dir), "escape")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("../escape written: %v", err)
			}
		})
	}
	if _, err := r.ImportLayers(ctx, "bad", parent, nil, Published{Digest: child.Digest, Layers: child.Layers}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("no layers: %v", err)
	}
}

// TestRegisterParentRefusesWhiteoutNames: a new entry named .wh.* cannot be
// stored in a layer (it would read as a deletion): the registration fails
// and nothing is registered.
func TestRegisterParentRefusesWhiteoutNames(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	parent, err := r.Register(ctx, "parent", Meta{}, func(ctx context.Context, rootfs string) error {
		return os.WriteFile(filepath.Join(rootfs, "f"), []byte("f"), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Register(ctx, "child", Meta{Parent: &parent}, func(ctx context.Context, rootfs string) error {
		if err := LinkTree(ctx, parent.RootfsPath, rootfs); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(rootfs, ".wh.f"), nil, 0o644)
	})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("got %v", err)
	}
	if _, err := r.Get(ctx, "child"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("registered anyway: %v", err)
	}
}
