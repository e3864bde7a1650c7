package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cube-dev/cube/internal/nativebin"
)

// epoch is the timestamp of every file, layer and config, so rebuilding
// from the same binaries gives the same digest.
var epoch = time.Unix(0, 0).UTC()

// Binaries are the static programs an image can carry, built like `make
// build` but with CGO_ENABLED=0 for cube too, like the Dockerfiles.
var Binaries = map[string]string{
	"cube":            "github.com/cube-dev/cube/cmd/cube",
	"envd":            "github.com/cube-dev/cube/cmd/envd",
	"cube-shim":       "github.com/cube-dev/cube/cmd/cube-shim",
	"cube-supervisor": "github.com/cube-dev/cube/cmd/cube-supervisor",
	"cube-interp":     "github.com/cube-dev/cube/cmd/cube-interp",
}

// The static C programs an image can carry are nativebin.Sources.

// Spec describes one image: the Debian packages of its base, which binary
// goes where, and its config.
type Spec struct {
	Name string
	// Packages installed over Debian minbase, as the Dockerfile's
	// `apt-get install --no-install-recommends` lists them.
	Packages   []string
	Files      map[string]string // path in the image -> binary name
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	Labels     map[string]string
}

// Specs are the four images the chart uses (values images.*), named like
// deploy/images/<name>, with the packages their Dockerfiles install
// (TestSpecsMatchDockerfiles keeps the two lists equal).
func Specs(ver string) []Spec {
	labels := func(title string) map[string]string {
		return map[string]string{
			"org.opencontainers.image.title":   title,
			"org.opencontainers.image.version": ver,
			"org.opencontainers.image.source":  "https://github.com/cube-dev/cube",
		}
	}
	// Debian's default PATH (the Dockerfiles' base image sets the same): the
	// cubelet runs mkfs.ext4 and debootstrap, which live in /usr/sbin.
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cube := []string{"/usr/local/bin/cube"}
	return []Spec{
		{
			Name:       "cube-server",
			Packages:   []string{"ca-certificates"},
			Files:      map[string]string{"/usr/local/bin/cube": "cube"},
			Entrypoint: cube, Cmd: []string{"server"},
			Env: env, WorkingDir: "/var/lib/cube", Labels: labels("cube-server"),
		},
		{
			Name: "cubelet",
			// mkfs.ext4 for sandbox disks; debootstrap (+ ca-certificates)
			// for the base template; ip for diagnostics.
			Packages: []string{"ca-certificates", "debootstrap", "e2fsprogs", "iproute2"},
			Files: map[string]string{
				"/usr/local/bin/cube":            "cube",
				"/usr/local/bin/envd":            "envd",
				"/usr/local/bin/cube-shim":       "cube-shim",
				"/usr/local/bin/cube-supervisor": "cube-supervisor",
				"/usr/local/bin/cube-reaper":     "cube-reaper",
				"/usr/local/bin/cube-interp":     "cube-interp",
				"/usr/local/bin/cube-nsexec":     "cube-nsexec",
			},
			Entrypoint: cube, Cmd: []string{"cubelet"},
			Env: env, WorkingDir: "/var/lib/cube", Labels: labels("cubelet"),
		},
		{
			// The installer copies /opt/cube/artifacts to the host
			// (cube kube install-artifacts). The cubelet binds cube-interp
			// into code-interpreter sandboxes from next to envd, so it goes
			// wherever envd goes (TestInterpNextToEnvd).
			Name: "installer",
			Files: map[string]string{
				"/usr/local/bin/cube":                 "cube",
				"/opt/cube/artifacts/envd":            "envd",
				"/opt/cube/artifacts/cube-shim":       "cube-shim",
				"/opt/cube/artifacts/cube-supervisor": "cube-supervisor",
				"/opt/cube/artifacts/cube-reaper":     "cube-reaper",
				"/opt/cube/artifacts/cube-interp":     "cube-interp",
				"/opt/cube/artifacts/cube-nsexec":     "cube-nsexec",
			},
			Entrypoint: cube, Cmd: []string{"kube", "install-artifacts", "--hold"},
			Env: env, WorkingDir: "/", Labels: labels("cube-installer"),
		},
		{
			Name:       "node-init",
			Packages:   []string{"ca-certificates"},
			Files:      map[string]string{"/usr/local/bin/cube": "cube"},
			Entrypoint: cube, Cmd: []string{"preflight"},
			Env: env, WorkingDir: "/", Labels: labels("cube-node-init"),
		},
	}
}

// buildBinaries builds every binary of Binaries and nativebin.Sources into dir,
// static and reproducible (-trimpath, no build VCS stamp).
func buildBinaries(ctx context.Context, dir, ver string) error {
	names := make([]string, 0, len(Binaries))
	for n := range Binaries {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
			"-ldflags=-s -w -X github.com/cube-dev/cube/internal/version.Version="+ver,
			"-o", filepath.Join(dir, n), Binaries[n])
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build %s: %w", n, err)
		}
	}
	return nativebin.BuildAll(ctx, dir)
}

// Image assembles spec: the Debian base layers, then one layer with the
// binaries from bin; a fixed creation time, linux/GOARCH, OCI media types
// throughout.
func Image(spec Spec, base []v1.Layer, bin string) (v1.Image, error) {
	tarBytes, err := layerTar(spec.Files, bin)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image %s: layer: %w", spec.Name, err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for i, l := range base {
		what := "debootstrap --variant=minbase (debian:bookworm-slim)"
		if i > 0 {
			what = "debootstrap --include=" + strings.Join(sortedCopy(spec.Packages), ",")
		}
		if img, err = mutate.Append(img, mutate.Addendum{
			Layer:   l,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "hack/images: " + what, Comment: "debian base"},
		}); err != nil {
			return nil, fmt.Errorf("image %s: %w", spec.Name, err)
		}
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "hack/images: " + spec.Name, Comment: "static cube binaries"},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = spec.Env
	cf.Config.WorkingDir = spec.WorkingDir
	cf.Config.Labels = spec.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", spec.Name, err)
	}
	return img, nil
}

// WriteLayout writes spec over the base layers as a fresh OCI image layout
// at dir (replacing what was there) and returns the image digest.
func WriteLayout(dir string, spec Spec, base []v1.Layer, bin string) (v1.Hash, error) {
	img, err := Image(spec, base, bin)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return v1.Hash{}, err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image %s: %w", spec.Name, err)
	}
	ref := spec.Labels["org.opencontainers.image.version"]
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": strings.TrimPrefix(ref, "v"),
	})); err != nil {
		return v1.Hash{}, fmt.Errorf("image %s: write layout: %w", spec.Name, err)
	}
	return img.Digest()
}

// layerTar returns an uncompressed tar with every file of files (image path
// -> binary in bin) at mode 0755, owned by root, plus its parent
// directories, in a fixed order with fixed times.
func layerTar(files map[string]string, bin string) ([]byte, error) {
	paths := make([]string, 0, len(files))
	dirs := map[string]bool{}
	for p := range files {
		paths = append(paths, p)
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		paths = append(paths, d+"/")
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		name := strings.TrimPrefix(p, "/")
		if strings.HasSuffix(p, "/") {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
			continue
		}
		data, err := os.ReadFile(filepath.Join(bin, files[p]))
		if err != nil {
			return nil, fmt.Errorf("binary %s for %s: %w (pass a directory of CGO_ENABLED=0 builds, or omit -bin to build them)", files[p], p, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
