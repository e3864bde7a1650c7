// Package imagetest builds small container images for tests and serves
// them from go-containerregistry's in-process registry over plain HTTP on
// loopback, so image imports run against a real registry protocol without
// network access. Only tests import it.
package imagetest

import (
	"bytes"
	"encoding/base64"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Layer is an uncompressed layer of the tar bytes data.
func Layer(t testing.TB, data []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image is an image for this host's platform (linux/runtime.GOARCH) of the
// given layers (tar bytes, lowest first) with cfg as its config.
func Image(t testing.TB, cfg v1.Config, layers ...[]byte) v1.Image {
	t.Helper()
	return ImageFor(t, runtime.GOARCH, cfg, layers...)
}

// ImageFor is Image for platform linux/arch.
func ImageFor(t testing.TB, arch string, cfg v1.Config, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, data := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, Layer(t, data)); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", arch, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// LayerDigest is the digest of img's only layer (the blob Registry.BlobReads
// counts when an import pulls it).
func LayerDigest(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1", len(layers))
	}
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Layout writes img to a fresh OCI image layout directory (under
// t.TempDir) and returns its path.
func Layout(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// DockerLogin writes dir/config.json as `docker login host` does, holding
// user's credentials for host (point $DOCKER_CONFIG at dir to use it).
func DockerLogin(t testing.TB, dir, host, user, password string) {
	t.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"auths":{"`+host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Registry is an in-process registry for one test, closed when it ends.
type Registry struct {
	// Host is the registry's HOST:PORT (127.0.0.1:PORT), the first part of
	// its image references.
	Host string

	auth authn.Authenticator // for Push; nil without basic auth

	mu    sync.Mutex
	reads map[string]int // GETs of each blob, by digest
}

// Option configures a Registry.
type Option func(*options)

type options struct{ user, password string }

// BasicAuth makes the registry answer 401 with a Basic challenge to every
// request without these credentials (Push uses them).
func BasicAuth(user, password string) Option {
	return func(o *options) { o.user, o.password = user, password }
}

// NewRegistry starts a registry on loopback (plain HTTP).
func NewRegistry(t testing.TB, opts ...Option) *Registry {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	r := &Registry{reads: map[string]int{}}
	if o.user != "" {
		r.auth = &authn.Basic{Username: o.user, Password: o.password}
	}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if o.user != "" {
			if u, p, ok := req.BasicAuth(); !ok || u != o.user || p != o.password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
		}
		if i := strings.LastIndex(req.URL.Path, "/blobs/"); i >= 0 && req.Method == http.MethodGet {
			r.mu.Lock()
			r.reads[req.URL.Path[i+len("/blobs/"):]]++
			r.mu.Unlock()
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.Host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

// BlobReads is how many times the blob of digest d was read (GET) so far;
// resolving an image reads its manifest and config, pulling it reads its
// layers too.
func (r *Registry) BlobReads(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reads[d.String()]
}

// Push writes img (a v1.Image or a v1.ImageIndex) to the registry as
// repoTag (e.g. "team/app:1") and returns its full reference,
// HOST:PORT/repoTag.
func (r *Registry) Push(t testing.TB, repoTag string, img remote.Taggable) string {
	t.Helper()
	ref := r.Host + "/" + repoTag
	n, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	var opts []remote.Option
	if r.auth != nil {
		opts = append(opts, remote.WithAuth(r.auth))
	}
	if err := remote.Push(n, img, opts...); err != nil {
		t.Fatal(err)
	}
	return ref
}
