package roles

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/imagetest"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// smallImage is a one-layer image for this host's platform holding file
// with content, with an Env and a WorkingDir.
func smallImage(t *testing.T, file, content string) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: file, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content)), Uid: 1234, Gid: 1234},
	} {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return imagetest.Image(t, v1.Config{Env: []string{"GREETING=hi"}, WorkingDir: "/srv"}, buf.Bytes())
}

// Builds' images are imported from a real (in-process, plain-HTTP,
// basic-auth) registry into a real template registry: with the build's
// credentials only, once per digest, over plain HTTP only when listed.
func TestRegistryImagesImport(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an image import keeps file owners")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	registry := imagetest.NewRegistry(t, imagetest.BasicAuth("bob", "pw"))
	host := registry.Host // 127.0.0.1:PORT
	app, other := smallImage(t, "etc/app.conf", "v1"), smallImage(t, "etc/other.conf", "v2")
	for ref, img := range map[string]v1.Image{"team/app:1": app, "team/app:copy": app, "team/other:1": other} {
		registry.Push(t, ref, img)
	}
	// The server's own docker credentials (valid here) are never used.
	cfgDir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", cfgDir)
	imagetest.DockerLogin(t, cfgDir, host, "bob", "pw")
	dir := t.TempDir()
	reg := &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
	images, err := newRegistryImages(reg, []string{" " + strings.ToUpper(host)})
	if err != nil {
		t.Fatal(err)
	}
	bob := &templatebuild.RegistryAuth{Username: "bob", Password: "pw"}
	ref := host + "/team/app:1"

	var progress bytes.Buffer
	_, err = images.Import(ctx, ref, nil, &progress)
	if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "pull "+ref+": registry "+host+" refused an anonymous pull; give its credentials with fromImage") {
		t.Fatalf("anonymous: %v", err)
	}
	_, err = images.Import(ctx, ref, &templatebuild.RegistryAuth{Username: "bob", Password: "wrong"}, &progress)
	if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), `refused the credentials of user "bob"`) {
		t.Fatalf("wrong password: %v", err)
	}

	progress.Reset()
	tpl, err := images.Import(ctx, ref, bob, &progress)
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := app.Digest()
	if tpl != templatebuild.ImageTemplate(digest.String()) {
		t.Fatalf("template %q, want %q for %s", tpl, templatebuild.ImageTemplate(digest.String()), digest)
	}
	for _, want := range []string{"resolved " + ref + " to " + host + "/team/app@" + digest.String(), "layer 1/1 sha256:"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
	got, err := reg.Get(ctx, tpl)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Defaults; d == nil || d.Env["GREETING"] != "hi" || d.Workdir != "/srv" {
		t.Fatalf("defaults %+v", got.Defaults)
	}
	var st os.FileInfo
	if st, err = os.Stat(filepath.Join(got.RootfsPath, "etc/app.conf")); err != nil || st.Size() != 2 {
		t.Fatalf("imported file: %v %v", st, err)
	}

	// The same image under another tag is the same template, not imported again.
	progress.Reset()
	again, err := images.Import(ctx, host+"/team/app:copy", bob, &progress)
	if err != nil || again != tpl || !strings.Contains(progress.String(), "already imported as template "+tpl) || strings.Contains(progress.String(), "layer") {
		t.Fatalf("same digest: %q %v\n%s", again, err, progress.String())
	}
	if now, _ := reg.Get(ctx, tpl); now.CreatedAt != got.CreatedAt {
		t.Fatalf("re-imported: %v then %v", got.CreatedAt, now.CreatedAt)
	}
	otherTpl, err := images.Import(ctx, host+"/team/other:1", bob, io.Discard)
	if err != nil || otherTpl == tpl || !templatebuild.IsImageTemplate(otherTpl) {
		t.Fatalf("other image: %q %v", otherTpl, err)
	}

	// A missing image fails naming it; nothing is registered.
	if _, err := images.Import(ctx, host+"/team/nothing:1", bob, io.Discard); !errors.Is(err, errdefs.ErrNotFound) ||
		!strings.Contains(err.Error(), host+"/team/nothing:1") || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("missing image: %v", err)
	}
	// An unreachable registry.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	goneHost := strings.TrimPrefix(gone.URL, "http://")
	reach, _ := newRegistryImages(reg, []string{goneHost})
	if _, err := reach.Import(ctx, goneHost+"/x:1", nil, io.Discard); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), goneHost+"/x:1") {
		t.Fatalf("unreachable registry: %v", err)
	}

	// A plain-HTTP registry the operator did not list is refused, naming the flag.
	strict, _ := newRegistryImages(reg, []string{"127.0.0.2:5000", "registry.local"})
	if _, err := strict.Import(ctx, ref, bob, io.Discard); !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "registry "+host+" is not reachable over HTTPS") || !strings.Contains(err.Error(), "--insecure-registry HOST[:PORT]") {
		t.Fatalf("unlisted plain-HTTP registry: %v", err)
	}
	// HOST alone lists every port of it.
	byHost, _ := newRegistryImages(reg, []string{"127.0.0.1"})
	if again, err := byHost.Import(ctx, ref, bob, io.Discard); err != nil || again != tpl {
		t.Fatalf("listed by host: %q %v", again, err)
	}

	// A template of that name holding something else is not taken for the image.
	if err := reg.Delete(ctx, otherTpl); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Register(ctx, otherTpl, template.Meta{Source: "dir:/elsewhere"}, func(context.Context, string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Import(ctx, host+"/team/other:1", bob, io.Discard); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "cube template rm "+otherTpl) {
		t.Fatalf("name taken: %v", err)
	}
}

func TestInsecureRegistries(t *testing.T) {
	for _, bad := range []string{"", "http://r:5000", "r:5000/path", "user@r", "r:port"} {
		if _, err := newRegistryImages(nil, []string{bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	m, err := newRegistryImages(nil, []string{"Reg.Local:5000", "10.0.0.5", "[::1]"})
	if err != nil {
		t.Fatal(err)
	}
	for registry, want := range map[string]bool{
		"reg.local:5000": true, "REG.LOCAL:5000": true, "reg.local:5001": false, "reg.local": false,
		"10.0.0.5": true, "10.0.0.5:5000": true, "10.0.0.50:5000": false,
		"[::1]:5000": true, "index.docker.io": false,
	} {
		if got := m.plainHTTP(registry); got != want {
			t.Errorf("plainHTTP(%q) = %v, want %v", registry, got, want)
		}
	}
}

// buildNode stands in for the node side of a build (sandboxes are not
// started here): a commit registers a template carrying the defaults.
type buildNode struct {
	reg     *template.Registry
	created []string
}

func (b *buildNode) CreateBuildSandbox(_ context.Context, parent string, _, _ int) (string, error) {
	b.created = append(b.created, parent)
	return "sbx-build", nil
}

func (b *buildNode) Envd(context.Context, string) (*http.Client, string, string, error) {
	return http.DefaultClient, "http://127.0.0.1:1", "", nil
}

func (b *buildNode) CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) error {
	d := req.Defaults
	_, err := b.reg.Register(ctx, req.Name, template.Meta{Source: "commit:" + req.SandboxID,
		Defaults: &template.Defaults{Env: d.Env, Workdir: d.Workdir, User: d.User}}, func(context.Context, string) error { return nil })
	return err
}

func (b *buildNode) KillSandbox(context.Context, string) error { return nil }

// The build service as the server wires it (newTemplateBuilds) builds
// fromImage: the image is imported under step "base" and the build starts
// from it with the image's defaults; a missing image fails the build with
// a reason naming it.
func TestTemplateBuildFromImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an image import keeps file owners")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	registry := imagetest.NewRegistry(t)
	host := registry.Host
	img := smallImage(t, "etc/app.conf", "v1")
	registry.Push(t, "app:1", img)
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg := &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
	node := &buildNode{reg: reg}
	svc, err := newTemplateBuilds(ctx, dir, st, node, templatebuild.RegistryTemplates{Registry: reg}, reg, nil, []string{host}, nil,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()

	build := func(image string) (templatebuild.BuildInfo, string) {
		req, err := svc.RequestBuild(ctx, templatebuild.BuildRequest{Name: "app"})
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.StartBuild(ctx, "app", req.BuildID, templatebuild.BuildSpec{FromImage: image}); err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		for offset := 0; ; {
			info, err := svc.Status(ctx, "app", req.BuildID, offset)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range info.LogEntries {
				logs.WriteString(e.Step + "|" + e.Message + "\n")
			}
			offset += len(info.LogEntries)
			if (info.Status == "ready" || info.Status == "error") && len(info.LogEntries) == 0 {
				return info, logs.String()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	digest, _ := img.Digest()
	want := templatebuild.ImageTemplate(digest.String())
	info, logs := build(host + "/app:1")
	if info.Status != "ready" {
		t.Fatalf("build: %+v %+v\n%s", info, info.Reason, logs)
	}
	for _, line := range []string{"base|pulling image " + host + "/app:1\n", "base|resolved " + host + "/app:1 to " + host + "/app@" + digest.String() + "\n",
		"base|layer 1/1 sha256:", "base|building template app from " + want + "\n"} {
		if !strings.Contains(logs, line) {
			t.Errorf("log lacks %q:\n%s", line, logs)
		}
	}
	if got, err := reg.Get(ctx, "app"); err != nil || len(node.created) != 1 || node.created[0] != want ||
		got.Defaults == nil || got.Defaults.Workdir != "/srv" || got.Defaults.Env["GREETING"] != "hi" {
		t.Fatalf("built %+v %v from %v", got, err, node.created)
	}

	info, logs = build(host + "/missing:1")
	if info.Status != "error" || info.Reason == nil || info.Reason.Step != "base" ||
		!strings.HasPrefix(info.Reason.Message, "image "+host+"/missing:1: pull "+host+"/missing:1: image not found in the registry") {
		t.Fatalf("missing image: %+v %+v\n%s", info, info.Reason, logs)
	}
	if len(node.created) != 1 {
		t.Fatalf("a sandbox started for a missing image: %v", node.created)
	}
}
