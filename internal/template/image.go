package template

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ImageSource names a container image to import: exactly one of Ref (a
// registry reference) and Path (an OCI image layout directory, or a tar
// written by `docker save` or as an OCI archive, optionally gzipped).
type ImageSource struct {
	Ref  string
	Path string
	// InsecureRegistry allows plain HTTP to Ref's registry. Without it
	// only HTTPS is used, loopback and private addresses included.
	InsecureRegistry bool
	// Platform picks the image from a multi-platform index; nil means the
	// host's (linux/GOARCH).
	Platform *v1.Platform
	// Keychain finds registry credentials; nil means authn.DefaultKeychain
	// (docker's config.json, $DOCKER_CONFIG, credential helpers).
	Keychain authn.Keychain
	// Progress, if set, gets a line per layer as it is applied.
	Progress io.Writer
}

func (s ImageSource) platform() v1.Platform {
	if s.Platform != nil {
		return *s.Platform
	}
	p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if p.Architecture == "arm64" {
		p.Variant = "v8"
	}
	return p
}

// resolveImage returns the image src names for its platform and a
// description for the template's Source. scratch is a directory the caller
// removes afterwards (an OCI archive is unpacked there).
func resolveImage(ctx context.Context, src ImageSource, scratch string) (v1.Image, string, error) {
	if src.Ref != "" {
		return remoteImage(ctx, src)
	}
	return localImage(ctx, src, scratch)
}

// plainHTTPHint is part of every refusal by httpsOnly.
const plainHTTPHint = "pass --insecure-registry to allow plain HTTP to it"

// httpsOnly refuses plain-HTTP requests, which go-containerregistry would
// otherwise send to loopback and private-network registries on its own.
type httpsOnly struct{ base http.RoundTripper }

func (h httpsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "https" {
		return nil, fmt.Errorf("registry %s is not reachable over HTTPS; %s", req.URL.Host, plainHTTPHint)
	}
	return h.base.RoundTrip(req)
}

func remoteImage(ctx context.Context, src ImageSource) (v1.Image, string, error) {
	var opts []name.Option
	if src.InsecureRegistry {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(src.Ref, opts...)
	if err != nil {
		return nil, "", fmt.Errorf("image reference %q: %v: %w", src.Ref, err, errdefs.ErrInvalidArgument)
	}
	kc := src.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	var rt http.RoundTripper = remote.DefaultTransport
	if !src.InsecureRegistry {
		rt = httpsOnly{rt}
	}
	want := src.platform()
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithTransport(rt), remote.WithPlatform(want)}
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, "", registryError(ref, err)
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, "", registryError(ref, err)
		}
		img, d, err := pickPlatform(idx, want)
		if err != nil {
			return nil, "", fmt.Errorf("image %s: %w", ref, err)
		}
		return img, "image:" + ref.Context().Name() + "@" + d.String(), nil
	}
	img, err := desc.Image()
	if err != nil {
		return nil, "", registryError(ref, err)
	}
	if err := checkPlatform(img, want); err != nil {
		return nil, "", fmt.Errorf("image %s: %w", ref, err)
	}
	return img, "image:" + ref.Context().Name() + "@" + desc.Digest.String(), nil
}

// registryError maps registry failures onto error kinds.
func registryError(ref name.Reference, err error) error {
	msg := err.Error()
	if strings.Contains(msg, plainHTTPHint) || strings.Contains(msg, "server gave HTTP response to HTTPS client") {
		return fmt.Errorf("pull %s: registry %s speaks plain HTTP; %s: %w", ref, ref.Context().RegistryStr(), plainHTTPHint, errdefs.ErrFailedPrecondition)
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("pull %s: image not found in the registry: %w", ref, errdefs.ErrNotFound)
		case http.StatusUnauthorized:
			return fmt.Errorf("pull %s: %v (log in with `docker login`, credentials are read from $DOCKER_CONFIG or ~/.docker/config.json): %w", ref, err, errdefs.ErrUnauthenticated)
		case http.StatusForbidden:
			return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrPermissionDenied)
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pull %s: %w", ref, err)
	}
	return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrUnavailable)
}

// localImage opens an OCI layout directory, a docker-save tar or an OCI
// archive tar.
func localImage(ctx context.Context, src ImageSource, scratch string) (v1.Image, string, error) {
	abs, err := filepath.Abs(src.Path)
	if err != nil {
		return nil, "", fmt.Errorf("image %s: %w", src.Path, err)
	}
	fi, err := os.Stat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("image %s: %w", src.Path, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, "", fmt.Errorf("image %s: %w", src.Path, err)
	}
	dir := abs
	if !fi.IsDir() {
		kind, err := archiveKind(abs)
		if err != nil {
			return nil, "", err
		}
		if kind == "docker" {
			img, err := tarball.Image(tarOpener(abs), nil)
			if err != nil {
				return nil, "", fmt.Errorf("image %s: %v: %w", src.Path, err, errdefs.ErrInvalidArgument)
			}
			if err := checkPlatform(img, src.platform()); err != nil {
				return nil, "", fmt.Errorf("image %s: %w", src.Path, err)
			}
			id, err := img.ConfigName()
			if err != nil {
				return nil, "", fmt.Errorf("image %s: %v: %w", src.Path, err, errdefs.ErrInvalidArgument)
			}
			return img, "oci:" + abs + "@" + id.String(), nil
		}
		// An OCI archive is a layout directory in a tar: unpack it with the
		// safe extractor and read it as one.
		dir = filepath.Join(scratch, "layout")
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, "", err
		}
		if err := extractTarFile(ctx, abs, dir); err != nil {
			return nil, "", fmt.Errorf("image %s: %w", src.Path, err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("image %s: not an OCI image layout (index.json): %v: %w", src.Path, err, errdefs.ErrInvalidArgument)
	}
	img, d, err := pickPlatform(idx, src.platform())
	if err != nil {
		return nil, "", fmt.Errorf("image %s: %w", src.Path, err)
	}
	return img, "oci:" + abs + "@" + d.String(), nil
}

// archiveKind tells a docker-save tar (manifest.json) from an OCI archive
// (index.json); docker 25+ writes both, then the docker form is used.
func archiveKind(file string) (string, error) {
	rc, err := tarOpener(file)()
	if err != nil {
		return "", fmt.Errorf("image %s: %w", file, err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	kind := ""
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("image %s: not a tar archive: %v: %w", file, err, errdefs.ErrInvalidArgument)
		}
		switch strings.TrimPrefix(hdr.Name, "./") {
		case "manifest.json":
			return "docker", nil
		case "index.json":
			kind = "oci"
		}
	}
	if kind == "" {
		return "", fmt.Errorf("image %s: neither a `docker save` archive (manifest.json) nor an OCI archive (index.json): %w", file, errdefs.ErrInvalidArgument)
	}
	return kind, nil
}

// tarOpener opens file, decompressing it when it is gzipped.
func tarOpener(file string) tarball.Opener {
	return func() (io.ReadCloser, error) {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		br := bufio.NewReaderSize(f, 1<<16)
		if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
			zr, err := gzip.NewReader(br)
			if err != nil {
				f.Close()
				return nil, err
			}
			return readCloser{zr, f}, nil
		}
		return readCloser{br, f}, nil
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

// pickPlatform returns the image for want from idx (nested indexes
// included), or an error naming the platforms idx offers.
func pickPlatform(idx v1.ImageIndex, want v1.Platform) (v1.Image, v1.Hash, error) {
	var seen []string
	img, h, err := pickIn(idx, want, &seen, 0)
	if err != nil || img != nil {
		return img, h, err
	}
	sort.Strings(seen)
	avail := strings.Join(seen, ", ")
	if avail == "" {
		avail = "none"
	}
	return nil, v1.Hash{}, fmt.Errorf("no image for platform %s (available: %s): %w", want, avail, errdefs.ErrNotFound)
}

func pickIn(idx v1.ImageIndex, want v1.Platform, seen *[]string, depth int) (v1.Image, v1.Hash, error) {
	if depth > 4 {
		return nil, v1.Hash{}, fmt.Errorf("image index nested too deeply: %w", errdefs.ErrInvalidArgument)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("read image index: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	for _, d := range im.Manifests {
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("read image index %s: %v: %w", d.Digest, err, errdefs.ErrInvalidArgument)
			}
			if img, h, err := pickIn(child, want, seen, depth+1); err != nil || img != nil {
				return img, h, err
			}
		case d.MediaType.IsImage():
			if d.Platform == nil {
				// A layout with a single untagged image carries no platform:
				// the image's config says it.
				img, err := idx.Image(d.Digest)
				if err != nil {
					return nil, v1.Hash{}, fmt.Errorf("read image %s: %v: %w", d.Digest, err, errdefs.ErrInvalidArgument)
				}
				cf, err := img.ConfigFile()
				if err != nil {
					return nil, v1.Hash{}, fmt.Errorf("read image config %s: %v: %w", d.Digest, err, errdefs.ErrInvalidArgument)
				}
				if p := cf.Platform(); p != nil && p.OS != "" && !platformMatches(*p, want) {
					*seen = append(*seen, p.String())
					continue
				}
				return img, d.Digest, nil
			}
			if d.Platform.OS == "unknown" {
				continue // attestation manifests (buildkit)
			}
			if !platformMatches(*d.Platform, want) {
				*seen = append(*seen, d.Platform.String())
				continue
			}
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("read image %s: %v: %w", d.Digest, err, errdefs.ErrInvalidArgument)
			}
			return img, d.Digest, nil
		}
	}
	return nil, v1.Hash{}, nil
}

func platformMatches(have, want v1.Platform) bool {
	if have.OS != want.OS || have.Architecture != want.Architecture {
		return false
	}
	return have.Variant == "" || want.Variant == "" || have.Variant == want.Variant
}

// checkPlatform refuses a single-platform image built for another platform.
func checkPlatform(img v1.Image, want v1.Platform) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read image config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if p := cf.Platform(); p != nil && p.OS != "" && !platformMatches(*p, want) {
		return fmt.Errorf("image is for platform %s, this host runs %s (available: %s): %w", p, want, p, errdefs.ErrNotFound)
	}
	return nil
}
