package main

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestLayouts builds the real static binaries, writes every image as an OCI
// layout, reopens it from disk and checks what a runtime would see: the
// config, the files and their modes, and that a rebuild gives the same
// digest.
func TestLayouts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cube, envd, cube-shim, cube-supervisor and cube-reaper (minutes on a cold build cache)")
	}
	bin := t.TempDir()
	if err := buildBinaries(context.Background(), bin, "v9.8.7"); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	for _, spec := range Specs("v9.8.7") {
		t.Run(spec.Name, func(t *testing.T) {
			dir := filepath.Join(out, spec.Name)
			want, err := WriteLayout(dir, spec, bin)
			if err != nil {
				t.Fatal(err)
			}
			img := openOnly(t, dir)
			if d, _ := img.Digest(); d != want {
				t.Fatalf("layout holds %s, WriteLayout returned %s", d, want)
			}
			checkConfig(t, img, spec)
			checkFiles(t, img, spec)

			// Rebuild into a second layout: same bytes, same digest.
			again, err := WriteLayout(filepath.Join(out, spec.Name+"-again"), spec, bin)
			if err != nil {
				t.Fatal(err)
			}
			if again != want {
				t.Errorf("rebuild digest %s, first build %s: the image is not reproducible", again, want)
			}
		})
	}
}

// openOnly reopens the layout at dir and returns its single image.
func openOnly(t *testing.T, dir string) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("layout has %d manifests, want 1", len(m.Manifests))
	}
	d := m.Manifests[0]
	if d.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want %s", d.MediaType, types.OCIManifestSchema1)
	}
	if d.Annotations["org.opencontainers.image.ref.name"] != "9.8.7" {
		t.Errorf("ref.name annotation %q, want 9.8.7", d.Annotations["org.opencontainers.image.ref.name"])
	}
	img, err := p.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func checkConfig(t *testing.T, img v1.Image, spec Spec) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/cube"}) {
		t.Errorf("entrypoint %q, want [/usr/local/bin/cube]", c.Entrypoint)
	}
	if !slices.Equal(c.Cmd, spec.Cmd) || len(c.Cmd) == 0 {
		t.Errorf("cmd %q, want %q", c.Cmd, spec.Cmd)
	}
	if c.WorkingDir != spec.WorkingDir || !slices.Equal(c.Env, spec.Env) {
		t.Errorf("workdir %q env %q, want %q %q", c.WorkingDir, c.Env, spec.WorkingDir, spec.Env)
	}
	if v := c.Labels["org.opencontainers.image.version"]; v != "v9.8.7" {
		t.Errorf("version label %q, want v9.8.7", v)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	if !cf.Created.Time.Equal(epoch) {
		t.Errorf("created %s, want the fixed %s", cf.Created.Time, epoch)
	}
}

func checkFiles(t *testing.T, img v1.Image, spec Spec) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	seen := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		p := "/" + h.Name
		if _, ok := spec.Files[p]; !ok {
			t.Errorf("unexpected file %s in the layer", p)
			continue
		}
		seen[p] = true
		if h.FileInfo().Mode().Perm() != 0o755 || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mode %v uid %d gid %d, want 0755 root:root", p, h.FileInfo().Mode().Perm(), h.Uid, h.Gid)
		}
		if h.Size < 1<<20 {
			t.Errorf("%s: %d bytes, not a built binary", p, h.Size)
		}
		if !h.ModTime.Equal(epoch) {
			t.Errorf("%s: mtime %s, want %s", p, h.ModTime, epoch)
		}
	}
	for p := range spec.Files {
		if !seen[p] {
			t.Errorf("%s missing from the layer", p)
		}
	}
}
