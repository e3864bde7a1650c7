package template

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// TestImportLayersOntoEmpty: with the zero Template as lower, the bottom
// layer (a flat template's rootfs, as WriteLayerTar of its rootfs wrote
// it) is the whole rootfs: a template of that one layer is flat, with the
// flat template's digest, xattrs, sizes and defaults, and serves its layer
// itself; a layered template is made from its whole stack the same way.
// A layer whose digest is not its ref's, a single layer that is not the
// template's digest, a tar with ../ and a lower that is no template
// (named, no rootfs) each leave nothing registered or staged.
func TestImportLayersOntoEmpty(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	parent, child := registerParentChild(t, ctx, r)
	tarOf := func(dir string) []byte {
		var b bytes.Buffer
		if err := WriteLayerTar(ctx, dir, &b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	bottom, top := tarOf(parent.TopLayerDir()), tarOf(child.TopLayerDir())
	parentXD, err := XattrDigest(ctx, parent.RootfsPath)
	if err != nil {
		t.Fatal(err)
	}

	r2 := newTestRegistry(t)
	opened := 0
	pub := Published{Digest: parent.Digest, XattrDigest: parentXD, Layers: []LayerRef{{Digest: parent.Digest}},
		CPUCount: 2, MemoryMB: 700, Defaults: &Defaults{Workdir: "/srv", Env: map[string]string{"A": "b"}}}
	flat, err := r2.ImportLayers(ctx, "image-0123456789abcdef", Template{},
		[]LayerSource{{Ref: LayerRef{Digest: parent.Digest}, Open: countingOpener(bottom, &opened)}}, pub)
	if err != nil {
		t.Fatal(err)
	}
	if flat.Digest != parent.Digest || len(flat.Layers) != 0 || flat.Source != StreamSource || flat.MemoryMB != 700 ||
		flat.Defaults == nil || flat.Defaults.Env["A"] != "b" || opened != 1 {
		t.Fatalf("imported %+v (opened %d)", flat, opened)
	}
	if d, err := Digest(ctx, flat.RootfsPath); err != nil || d != parent.Digest {
		t.Fatalf("rootfs digest %s, %v", d, err)
	}
	if xd, _ := XattrDigest(ctx, flat.RootfsPath); xd != parentXD {
		t.Fatalf("xattr digest %s, want %s", xd, parentXD)
	}
	if b, _ := os.ReadFile(filepath.Join(r2.Dir, flat.Name, metaFile)); strings.Contains(string(b), "layers") {
		t.Fatalf("a one-layer template.json has layers: %s", b)
	}
	if _, err := os.Lstat(filepath.Join(r2.Dir, flat.Name, layerDir)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a flat template keeps a layer dir: %v", err)
	}
	if dir, err := r2.LayerDir(ctx, parent.Digest); err != nil || dir != flat.RootfsPath {
		t.Fatalf("layer dir %q, %v", dir, err)
	}
	if !bytes.Equal(tarOf(flat.RootfsPath), bottom) {
		t.Fatal("the imported rootfs's layer tar differs from the one it came from")
	}
	if _, err := r2.ImportLayers(ctx, flat.Name, Template{}, []LayerSource{{Ref: LayerRef{Digest: parent.Digest}, Open: countingOpener(bottom, &opened)}}, pub); !errors.Is(err, errdefs.ErrAlreadyExists) || opened != 1 {
		t.Fatalf("again: %v (opened %d)", err, opened)
	}

	// The whole stack of a layered template onto nothing.
	both := []LayerSource{{Ref: child.Layers[0], Open: countingOpener(bottom, &opened)}, {Ref: child.Layers[1], Open: countingOpener(top, &opened)}}
	child2, err := r2.ImportLayers(ctx, "child", Template{}, both, Published{Digest: child.Digest, Layers: child.Layers})
	if err != nil {
		t.Fatal(err)
	}
	if child2.Digest != child.Digest || !reflect.DeepEqual(child2.Layers, child.Layers) || child2.Source != StreamSource {
		t.Fatalf("imported %+v", child2)
	}
	if d, err := Digest(ctx, child2.TopLayerDir()); err != nil || d != child.Layers[1].Digest {
		t.Fatalf("top layer dir digest %s, %v", d, err)
	}

	outside := t.TempDir()
	dotdot, err := os.ReadFile(writeTarFile(t, false, reg("../escape", "x", 0o644)))
	if err != nil {
		t.Fatal(err)
	}
	other := "sha256:" + strings.Repeat("cd", 32)
	cases := []struct {
		name  string
		lower Template
		tar   []byte
		ref   string // the layer's ref and the published stack; parent's digest when ""
		pub   string // the published digest; parent's when ""
		want  error
		opens int
	}{
		{name: "layer-digest", tar: bottom, ref: other, pub: other, want: errdefs.ErrConflict, opens: 1},
		{name: "layer-not-digest", tar: bottom, pub: other, want: errdefs.ErrInvalidArgument},
		{name: "dotdot", tar: dotdot, want: errdefs.ErrInvalidArgument, opens: 1},
		{name: "named-without-rootfs", lower: Template{Name: "ghost", Digest: parent.Digest}, tar: bottom, want: errdefs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref, digest := c.ref, c.pub
			if ref == "" {
				ref = parent.Digest
			}
			if digest == "" {
				digest = parent.Digest
			}
			n := 0
			_, err := r2.ImportLayers(ctx, "bad", c.lower, []LayerSource{{Ref: LayerRef{Digest: ref}, Open: countingOpener(c.tar, &n)}},
				Published{Digest: digest, Layers: []LayerRef{{Digest: ref}}})
			if !errors.Is(err, c.want) || n != c.opens {
				t.Fatalf("got %v (opened %d), want %v (opened %d)", err, n, c.want, c.opens)
			}
			if _, err := r2.Get(ctx, "bad"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("registered anyway: %v", err)
			}
			entries, _ := os.ReadDir(r2.Dir)
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), tmpPrefix) || e.Name() == "bad" {
					t.Errorf("left behind: %s", e.Name())
				}
			}
			if left, _ := os.ReadDir(outside); len(left) != 0 {
				t.Errorf("written outside: %v", left)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(r2.Dir), "escape")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("../escape written: %v", err)
			}
		})
	}
}
