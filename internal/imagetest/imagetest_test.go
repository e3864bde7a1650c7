package imagetest

import (
	"archive/tar"
	"bytes"
	"errors"
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

func oneFile(t *testing.T, file, body string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: file, Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(body))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A pushed image pulls back with its platform and config; only pulling a
// layer counts as reading its blob; without the credentials the registry
// refuses.
func TestRegistry(t *testing.T) {
	cfg := v1.Config{Env: []string{"A=b"}, WorkingDir: "/w"}
	img := Image(t, cfg, oneFile(t, "f", "x"))
	registry := NewRegistry(t, BasicAuth("u", "p"))
	ref := registry.Push(t, "team/app:1", img)
	if !strings.HasPrefix(ref, "127.0.0.1:") || !strings.HasSuffix(ref, "/team/app:1") {
		t.Fatalf("ref %q", ref)
	}
	layer := LayerDigest(t, img)
	if n := registry.BlobReads(layer); n != 0 {
		t.Fatalf("push read the layer %d times", n)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	_, err = remote.Image(r)
	var terr *transport.Error
	if !errors.As(err, &terr) || terr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous pull: %v", err)
	}
	got, err := remote.Image(r, remote.WithAuth(&authn.Basic{Username: "u", Password: "p"}))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := got.ConfigFile()
	if err != nil || cf.OS != "linux" || cf.Architecture != runtime.GOARCH || cf.Config.WorkingDir != "/w" || cf.Config.Env[0] != "A=b" {
		t.Fatalf("config %+v %v", cf, err)
	}
	if n := registry.BlobReads(layer); n != 0 {
		t.Fatalf("resolving read the layer %d times", n)
	}
	ls, _ := got.Layers()
	rc, err := ls[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if n := registry.BlobReads(layer); n != 1 {
		t.Fatalf("pulling read the layer %d times, want 1", n)
	}
}

func TestLayoutAndPlatform(t *testing.T) {
	img := ImageFor(t, "s390x", v1.Config{}, oneFile(t, "a", "1"), oneFile(t, "b", "2"))
	p, err := layout.FromPath(Layout(t, img))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		t.Fatalf("layout index %+v %v", m, err)
	}
	got, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := got.ConfigFile()
	ls, _ := got.Layers()
	if cf.Architecture != "s390x" || len(ls) != 2 {
		t.Fatalf("arch %s, %d layers", cf.Architecture, len(ls))
	}
}

// Only tests may import imagetest: it starts servers and fails tests, and
// it would link the in-process registry into a binary.
func TestOnlyTestsImportIt(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
		if err != nil {
			return nil // not ours to judge here
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "github.com/cube-dev/cube/internal/imagetest" {
				t.Errorf("%s imports imagetest; only _test.go files may", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
