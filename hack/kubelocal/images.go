package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// cubeImages are the images hack/images writes (one OCI layout each) and
// the chart's values that use them.
var cubeImages = []struct{ name, value string }{
	{"cube-server", "cubeServer"}, {"cubelet", "cubelet"}, {"installer", "installer"}, {"node-init", "nodeInit"},
}

// buildCubeImages runs hack/images (what `make images` runs) once per tag,
// each stamped with its tag as Cube's version, and writes one docker-archive
// tar per tag for `ctr images import`.
func buildCubeImages(ctx context.Context, c *Config) ([]string, error) {
	var tars []string
	for _, tag := range []string{c.Tag, c.TagNext} {
		out := c.p("images", tag)
		start := time.Now()
		if _, err := run(ctx, c.Repo, nil, "go", "run", "./hack/images", "-out", out, "-version", "v"+trimV(tag)); err != nil {
			return nil, fmt.Errorf("build Cube's images %s: %w", tag, err)
		}
		refs := map[name.Reference]v1.Image{}
		for _, im := range cubeImages {
			img, err := layoutImage(filepath.Join(out, im.name))
			if err != nil {
				return nil, err
			}
			ref, err := name.NewTag(c.image(im.name, tag))
			if err != nil {
				return nil, err
			}
			refs[ref] = img
		}
		tarPath := filepath.Join(out, "images.tar")
		if err := tarball.MultiRefWriteToFile(tarPath, refs); err != nil {
			return nil, fmt.Errorf("write %s: %w", tarPath, err)
		}
		slog.Info("built Cube's images", "tag", tag, "took", time.Since(start).Round(time.Second))
		tars = append(tars, tarPath)
	}
	return tars, nil
}

func trimV(s string) string {
	if len(s) > 0 && s[0] == 'v' {
		return s[1:]
	}
	return s
}

// layoutImage returns the one image of an OCI layout.
func layoutImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read OCI layout %s: %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("OCI layout %s holds %d manifests, want 1", dir, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// addonImages writes the pause and CoreDNS images (one static binary each
// on an empty base) to one tar.
func addonImages(c *Config, a assets) (string, error) {
	refs := map[name.Reference]v1.Image{}
	for _, im := range []struct{ ref, bin, path string }{
		{c.pauseImage(), a.pause, "/pause"},
		{c.corednsImage(), a.coredns, "/coredns"},
	} {
		img, err := binaryImage(im.bin, im.path)
		if err != nil {
			return "", err
		}
		ref, err := name.NewTag(im.ref)
		if err != nil {
			return "", err
		}
		refs[ref] = img
	}
	path := c.p("images", "addons.tar")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	if err := tarball.MultiRefWriteToFile(path, refs); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// binaryImage is an image holding the file bin at path, its entrypoint.
func binaryImage(bin, path string) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: path[1:], Mode: 0o755, Size: int64(len(data)), ModTime: time.Unix(0, 0)}); err != nil {
		return nil, err
	}
	tw.Write(data)
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = []string{path}
	return mutate.ConfigFile(img, cf)
}

// importImages loads docker-archive tars into containerd's k8s.io namespace,
// where the kubelet's CRI finds them.
func importImages(ctx context.Context, c *Config, tars ...string) error {
	for _, t := range tars {
		if _, err := run(ctx, c.Dir, nil, "ctr", "--address", c.containerdSock(), "-n", "k8s.io", "images", "import", t); err != nil {
			return fmt.Errorf("import %s: %w", t, err)
		}
	}
	return nil
}
