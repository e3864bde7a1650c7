package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/imagetest"
)

func tarBytes(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

var testImageConfig = v1.Config{
	Env:        []string{"PATH=/usr/local/bin:/bin", "FOO=bar baz"},
	WorkingDir: "/srv/app",
	User:       "app",
	Entrypoint: []string{"/bin/tool"},
	Cmd:        []string{"--serve"},
}

// testImage has two layers exercising whiteouts, an opaque directory, hard
// links, symlinks, setuid, owners, xattrs and type changes.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	home := dir("home/app/", 0o750)
	home.hdr.Uid, home.hdr.Gid = 1001, 1001
	l1 := tarBytes(t,
		dir("./", 0o755), dir("etc/", 0o755),
		reg("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n", 0o644),
		reg("etc/group", "root:x:0:\napp:x:1001:\n", 0o644),
		reg("bin/tool", "TOOL", 0o4755),
		reg("opq/a", "a", 0o644), reg("opq/b", "b", 0o644),
		reg("gone", "g", 0o644), reg("d2f/x", "x", 0o644), dir("usr/lib/", 0o755), home,
	)
	data := reg("data/x", "x", 0o644)
	data.hdr.PAXRecords = map[string]string{"SCHILYXATTR.user.cube": "kept"}
	l2 := tarBytes(t,
		reg(".wh.gone", "", 0o644),
		dir("opq/", 0o755), reg("opq/.wh..wh..opq", "", 0o644), reg("opq/c", "c", 0o644),
		hardlink("bin/hl", "bin/tool"),
		symlink("lib", "/usr/lib"),
		reg("d2f", "now a file", 0o644),
		data,
	)
	return imagetest.Image(t, testImageConfig, l1, l2)
}

// checkImported asserts the rootfs and metadata of a template made from
// testImage.
func checkImported(t *testing.T, tm Template, sourcePrefix string) {
	t.Helper()
	root := tm.RootfsPath
	if !strings.HasPrefix(tm.Source, sourcePrefix) || !strings.Contains(tm.Source, "@sha256:") {
		t.Errorf("source %q, want prefix %q and a digest", tm.Source, sourcePrefix)
	}
	if err := ValidateDigest(tm.Digest); err != nil {
		t.Error(err)
	}
	for _, p := range []string{"gone", "opq/a", "opq/b", "d2f/x"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s should be gone: %v", p, err)
		}
	}
	for p, want := range map[string]string{"opq/c": "c", "d2f": "now a file", "bin/hl": "TOOL"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	checkMode(t, filepath.Join(root, "bin/tool"), os.ModeSetuid|0o755, 0, 0)
	checkMode(t, filepath.Join(root, "home/app"), os.ModeDir|0o750, 1001, 1001)
	checkMode(t, filepath.Join(root, "srv/app"), os.ModeDir|0o755, 0, 0) // WORKDIR made
	var a, b syscall.Stat_t
	if syscall.Lstat(filepath.Join(root, "bin/tool"), &a) != nil || syscall.Lstat(filepath.Join(root, "bin/hl"), &b) != nil || a.Ino != b.Ino {
		t.Errorf("bin/hl is not a hard link of bin/tool")
	}
	if l, err := os.Readlink(filepath.Join(root, "lib")); err != nil || l != "/usr/lib" {
		t.Errorf("lib -> %q, %v", l, err)
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(root, "data/x"), "user.cube", buf); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("xattr user.cube of data/x = %q, %v", buf[:max(n, 0)], err)
	}
	checkPrepared(t, root, "/bin/sh")
	want := &Defaults{
		Env:     map[string]string{"PATH": "/usr/local/bin:/bin", "FOO": "bar baz"},
		Workdir: "/srv/app", User: "app", ImageUser: "app",
		Entrypoint: []string{"/bin/tool"}, Cmd: []string{"--serve"},
	}
	if !reflect.DeepEqual(tm.Defaults, want) {
		t.Errorf("defaults %+v, want %+v", tm.Defaults, want)
	}
}

func TestImportImageFromRegistry(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	registry := imagetest.NewRegistry(t)
	host := registry.Host
	registry.Push(t, "test/img:v1", testImage(t))
	r := newTestRegistry(t)

	// Plain HTTP needs the explicit opt-in.
	_, err := r.ImportImage(ctx, "img", ImageSource{Ref: host + "/test/img:v1"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "--insecure-registry") {
		t.Fatalf("plain HTTP without --insecure-registry: %v", err)
	}
	if ts, _ := r.List(ctx); len(ts) != 0 {
		t.Fatalf("refused import registered %v", ts)
	}
	tm, err := r.ImportImage(ctx, "img", ImageSource{Ref: host + "/test/img:v1", InsecureRegistry: true})
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, tm, "image:"+host+"/test/img@sha256:")
	got, err := r.Get(ctx, "img")
	if err != nil || !reflect.DeepEqual(got.Defaults, tm.Defaults) {
		t.Fatalf("template.json does not keep the defaults: %+v, %v", got.Defaults, err)
	}
	if _, err := r.ImportImage(ctx, "img", ImageSource{Ref: host + "/test/img:v1", InsecureRegistry: true}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second import: %v", err)
	}
	if _, err := r.ImportImage(ctx, "Bad Name", ImageSource{Ref: host + "/test/img:v1", InsecureRegistry: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad name: %v", err)
	}
	if _, err := r.ImportImage(ctx, "nope", ImageSource{Ref: host + "/test/missing:v1", InsecureRegistry: true}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing image: %v", err)
	}
	if _, err := r.ImportImage(ctx, "nope", ImageSource{Ref: "not a ref!", InsecureRegistry: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad reference: %v", err)
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // a registry that refuses connections
	if _, err := r.ImportImage(ctx, "nope", ImageSource{Ref: strings.TrimPrefix(gone.URL, "http://") + "/x:1", InsecureRegistry: true}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("unreachable registry: %v", err)
	}
	assertNoStaging(t, r)
}

func TestImportImagePlatforms(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	registry := imagetest.NewRegistry(t)
	host := registry.Host
	other := "s390x"
	if runtime.GOARCH == other {
		other = "amd64"
	}
	mine := imagetest.Image(t, v1.Config{Env: []string{"WHO=mine"}}, tarBytes(t, reg("which", "mine", 0o644)))
	theirs := imagetest.ImageFor(t, other, v1.Config{Env: []string{"WHO=theirs"}}, tarBytes(t, reg("which", "theirs", 0o644)))
	add := func(idx v1.ImageIndex, img v1.Image, arch string) v1.ImageIndex {
		return mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	registry.Push(t, "multi:v1", add(add(empty.Index, theirs, other), mine, runtime.GOARCH))
	registry.Push(t, "foreign:v1", add(empty.Index, theirs, other))
	registry.Push(t, "single-foreign:v1", theirs)
	r := newTestRegistry(t)

	tm, err := r.ImportImage(ctx, "multi", ImageSource{Ref: host + "/multi:v1", InsecureRegistry: true})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(tm.RootfsPath, "which")); string(b) != "mine" || tm.Defaults.Env["WHO"] != "mine" {
		t.Errorf("multi-platform index gave %q %v, want the host's image", b, tm.Defaults.Env)
	}
	for _, ref := range []string{"/foreign:v1", "/single-foreign:v1"} {
		_, err := r.ImportImage(ctx, "foreign", ImageSource{Ref: host + ref, InsecureRegistry: true})
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "linux/"+other) {
			t.Errorf("%s: %v, want not found naming linux/%s", ref, err, other)
		}
	}
	assertNoStaging(t, r)
}

func TestImportImageFromOCI(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	img := testImage(t)
	layoutDir := imagetest.Layout(t, img)

	dockerTar := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("example.com/test/img:v1")
	if err := tarball.WriteToFile(dockerTar, tag, img); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(t.TempDir(), "oci.tar")
	f, err := os.Create(ociTar)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteTar(ctx, layoutDir, f); err != nil {
		t.Fatal(err)
	}
	f.Close()

	r := newTestRegistry(t)
	for i, p := range []string{layoutDir, dockerTar, ociTar} {
		tm, err := r.ImportImage(ctx, "oci"+string(rune('a'+i)), ImageSource{Path: p})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		checkImported(t, tm, "oci:"+p+"@sha256:")
	}
	ts, _ := r.List(ctx)
	if len(ts) != 3 || ts[0].Digest != ts[1].Digest || ts[1].Digest != ts[2].Digest {
		t.Errorf("the three forms of one image gave different digests: %+v", ts)
	}

	notTar := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(notTar, bytes.Repeat([]byte("junk"), 300), 0o644)
	emptyTar := filepath.Join(t.TempDir(), "empty.tar")
	os.WriteFile(emptyTar, tarBytes(t, reg("hello", "x", 0o644)), 0o644)
	for p, kind := range map[string]error{
		filepath.Join(t.TempDir(), "missing"): errdefs.ErrNotFound,
		notTar:                                errdefs.ErrInvalidArgument,
		emptyTar:                              errdefs.ErrInvalidArgument,
		t.TempDir():                           errdefs.ErrInvalidArgument, // a directory without index.json
	} {
		if _, err := r.ImportImage(ctx, "bad", ImageSource{Path: p}); !errors.Is(err, kind) {
			t.Errorf("%s: %v, want %v", p, err, kind)
		}
	}
	if _, err := r.ImportImage(ctx, "bad", ImageSource{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no source: %v", err)
	}
	assertNoStaging(t, r)
}

// TestImportImageHostile: unsafe or damaged images fail cleanly: nothing
// registered, nothing left in the store, nothing written outside it.
func TestImportImageHostile(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("safe"), 0o644); err != nil {
		t.Fatal(err)
	}
	tampered := imagetest.Layout(t, imagetest.Image(t, v1.Config{}, tarBytes(t, reg("f", "original", 0o644))))
	// Replace the layer blob by another valid layer: same digest name,
	// other content.
	blobs, _ := filepath.Glob(filepath.Join(tampered, "blobs/sha256/*"))
	other, _ := imagetest.Layer(t, tarBytes(t, reg("f", "evil", 0o644))).Compressed()
	otherData, _ := io.ReadAll(other)
	replaced := false
	for _, b := range blobs {
		if data, _ := os.ReadFile(b); len(data) > 2 && data[0] == 0x1f && data[1] == 0x8b {
			os.WriteFile(b, otherData, 0o644)
			replaced = true
		}
	}
	if !replaced {
		t.Fatal("no layer blob found to tamper with")
	}
	tests := []struct {
		name string
		path string
		want error
	}{
		{"dotdot entry", imagetest.Layout(t, imagetest.Image(t, v1.Config{}, tarBytes(t, reg("../../../../../../"+victim, "pwned", 0o644)))), errdefs.ErrInvalidArgument},
		{"absolute symlink escape", imagetest.Layout(t, imagetest.Image(t, v1.Config{},
			tarBytes(t, symlink("esc", outside)), tarBytes(t, reg("esc/victim", "pwned", 0o644)))), errdefs.ErrInvalidArgument},
		{"hard link outside", imagetest.Layout(t, imagetest.Image(t, v1.Config{}, tarBytes(t, hardlink("l", "../"+victim)))), errdefs.ErrInvalidArgument},
		{"corrupt layer", imagetest.Layout(t, imagetest.Image(t, v1.Config{}, bytes.Repeat([]byte("not a tar "), 200))), errdefs.ErrInvalidArgument},
		{"tampered layer", tampered, errdefs.ErrConflict},
	}
	r := newTestRegistry(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.ImportImage(ctx, "hostile", ImageSource{Path: tc.path})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if b, _ := os.ReadFile(victim); string(b) != "safe" {
				t.Fatalf("victim outside the store changed: %q", b)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 1 {
				t.Fatalf("files appeared outside the store: %v", entries)
			}
			if _, err := r.Get(ctx, "hostile"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("hostile image registered: %v", err)
			}
			assertNoStaging(t, r)
		})
	}
}

func TestImageUserResolution(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	passwd := reg("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n", 0o644)
	tests := []struct{ user, want string }{
		{"", ""}, {"app", "app"}, {"1001", "app"}, {"1001:1001", "app"}, {"app:staff", "app"},
		{"0", "root"}, {"1000", UserName}, {"4242", ""}, {"ghost", ""},
	}
	for _, tc := range tests {
		t.Run(tc.user, func(t *testing.T) {
			r := newTestRegistry(t)
			img := imagetest.Image(t, v1.Config{User: tc.user}, tarBytes(t, passwd))
			tm, err := r.ImportImage(ctx, "u", ImageSource{Path: imagetest.Layout(t, img)})
			if err != nil {
				t.Fatal(err)
			}
			if tm.Defaults.User != tc.want || tm.Defaults.ImageUser != tc.user {
				t.Errorf("user %q -> %q (image %q), want %q", tc.user, tm.Defaults.User, tm.Defaults.ImageUser, tc.want)
			}
		})
	}
}

func TestImportImageCanceled(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := newTestRegistry(t)
	if _, err := r.ImportImage(ctx, "c", ImageSource{Path: imagetest.Layout(t, testImage(t))}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	assertNoStaging(t, r)
}

// TestImportImageCredentials: registry credentials come from docker's
// config.json ($DOCKER_CONFIG), as `docker login` writes them.
func TestImportImageCredentials(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	registry := imagetest.NewRegistry(t, imagetest.BasicAuth("alice", "s3cret"))
	host := registry.Host
	registry.Push(t, "private:v1", imagetest.Image(t, v1.Config{}, tarBytes(t, reg("secret", "x", 0o644))))
	cfgDir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", cfgDir)
	r := newTestRegistry(t)
	src := ImageSource{Ref: host + "/private:v1", InsecureRegistry: true}
	if _, err := r.ImportImage(ctx, "private", src); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "docker login") {
		t.Fatalf("without credentials: %v", err)
	}
	imagetest.DockerLogin(t, cfgDir, host, "alice", "s3cret")
	tm, err := r.ImportImage(ctx, "private", src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tm.RootfsPath, "secret")); err != nil {
		t.Fatal(err)
	}
}
