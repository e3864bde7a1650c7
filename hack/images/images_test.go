package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// built is what every image test shares: the binaries and the layouts of
// one `make images`, built once per test binary.
var built struct {
	once    sync.Once
	err     error
	bin     string
	out     string
	digests map[string]v1.Hash
	deb     *Debian
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range []string{built.bin, built.out} {
		if d != "" {
			_ = os.RemoveAll(d)
		}
	}
	os.Exit(code)
}

// buildAll builds the binaries and every image like `make images`, with
// the Debian cache `make images` uses (cold: debootstrap, minutes).
func buildAll(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds cube, envd, cube-shim, cube-supervisor, cube-reaper, cube-interp and cube-nsexec and debootstraps Debian (minutes when cold)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: debootstrap makes the Debian base (run `make images` as root)")
	}
	built.once.Do(func() {
		built.err = func() error {
			var err error
			if built.bin, err = os.MkdirTemp("", "cube-images-bin-"); err != nil {
				return err
			}
			if built.out, err = os.MkdirTemp("", "cube-images-out-"); err != nil {
				return err
			}
			if err := buildBinaries(context.Background(), built.bin, "v9.8.7"); err != nil {
				return err
			}
			built.deb = NewDebian(filepath.Join(cacheDir(), "images"))
			built.digests = map[string]v1.Hash{}
			for _, spec := range Specs("v9.8.7") {
				base, err := built.deb.Layers(context.Background(), spec.Packages)
				if err != nil {
					return err
				}
				d, err := WriteLayout(filepath.Join(built.out, spec.Name), spec, base, built.bin)
				if err != nil {
					return err
				}
				built.digests[spec.Name] = d
			}
			return nil
		}()
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
}

// TestLayouts reopens every image layout from disk and checks what a
// runtime would see: the config, the layers, the binaries and their modes,
// and that a rebuild gives the same digest.
func TestLayouts(t *testing.T) {
	buildAll(t)
	for _, spec := range Specs("v9.8.7") {
		t.Run(spec.Name, func(t *testing.T) {
			dir := filepath.Join(built.out, spec.Name)
			img := openOnly(t, dir)
			if d, _ := img.Digest(); d != built.digests[spec.Name] {
				t.Fatalf("layout holds %s, WriteLayout returned %s", d, built.digests[spec.Name])
			}
			checkConfig(t, img, spec)
			checkFiles(t, img, spec)

			// Rebuild into a second layout from the same cache: same bytes,
			// same digest.
			base, err := built.deb.Layers(context.Background(), spec.Packages)
			if err != nil {
				t.Fatal(err)
			}
			again, err := WriteLayout(filepath.Join(t.TempDir(), spec.Name), spec, base, built.bin)
			if err != nil {
				t.Fatal(err)
			}
			if again != built.digests[spec.Name] {
				t.Errorf("rebuild digest %s, first build %s: the image is not reproducible", again, built.digests[spec.Name])
			}
		})
	}
	// The Debian minbase layer is one blob for all four images.
	var first v1.Hash
	for i, spec := range Specs("v9.8.7") {
		layers, err := openOnly(t, filepath.Join(built.out, spec.Name)).Layers()
		if err != nil {
			t.Fatal(err)
		}
		d, _ := layers[0].Digest()
		if i == 0 {
			first = d
		} else if d != first {
			t.Errorf("%s: base layer %s, %s has %s: the minbase layer is not shared", spec.Name, d, Specs("")[0].Name, first)
		}
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

// checkFiles checks the layers: Debian minbase, the packages (when the
// image has any), then the binaries.
func checkFiles(t *testing.T, img v1.Image, spec Spec) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	want := 2
	if len(spec.Packages) > 0 {
		want = 3
	}
	if len(layers) != want {
		t.Fatalf("%d layers, want %d (minbase, packages when any, binaries)", len(layers), want)
	}
	for _, l := range layers {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer media type %s, want %s", mt, types.OCILayer)
		}
	}
	rc, err := layers[len(layers)-1].Uncompressed()
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
			t.Errorf("unexpected file %s in the binaries layer", p)
			continue
		}
		seen[p] = true
		if h.FileInfo().Mode().Perm() != 0o755 || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mode %v uid %d gid %d, want 0755 root:root", p, h.FileInfo().Mode().Perm(), h.Uid, h.Gid)
		}
		if h.Size < 256<<10 {
			t.Errorf("%s: %d bytes, not a built binary", p, h.Size)
		}
		// Static: envd, cube-reaper and cube-interp run inside sandboxes
		// whose rootfs need not have a loader or libc; cube-nsexec starts
		// in a sandbox's mount namespace.
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if f, err := elf.NewFile(bytes.NewReader(data)); err != nil {
			t.Errorf("%s: not an ELF binary: %v", p, err)
		} else if slices.ContainsFunc(f.Progs, func(pr *elf.Prog) bool { return pr.Type == elf.PT_INTERP }) {
			t.Errorf("%s: dynamically linked (has an ELF interpreter), want CGO_ENABLED=0 (Go) or gcc -static (C)", p)
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

// specByName returns the spec named name.
func specByName(t *testing.T, name string) Spec {
	t.Helper()
	for _, s := range Specs("v9.8.7") {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no image %s", name)
	return Spec{}
}

// unpack flattens the image of layout dir the way a runtime does
// (whiteouts applied) into a fresh directory.
func unpack(t *testing.T, dir string) string {
	t.Helper()
	rc := mutate.Extract(openOnly(t, dir))
	defer rc.Close()
	root := t.TempDir()
	if err := extractTar(rc, root); err != nil {
		t.Fatal(fmt.Errorf("unpack %s: %w", dir, err))
	}
	return root
}
