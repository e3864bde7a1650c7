package cli

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cube-dev/cube/internal/template"
)

// cliTestImage is a one-layer image with a passwd entry for its USER.
func cliTestImage(t *testing.T, user string) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n",
		"bin/hello":  "hello",
	} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"GREETING=hi"}, WorkingDir: "/work", User: user, Cmd: []string{"/bin/hello"}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestTemplateCreateFromImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an import keeps file owners")
	}
	clearEnv(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, _ := name.ParseReference(host+"/app:1", name.Insecure)
	if err := remote.Write(ref, cliTestImage(t, "app")); err != nil {
		t.Fatal(err)
	}
	lay := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(lay, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(cliTestImage(t, "4242")); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()

	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"create", "web", "--from-image", host + "/app:1"}, 1, "", "--insecure-registry"},
		{[]string{"create", "web", "--from-image", host + "/app:1", "--insecure-registry"}, 0, "template web registered (sha256:", ""},
		{[]string{"create", "web2", "--from-image", host + "/nothing:1", "--insecure-registry"}, 1, "", "not found"},
		{[]string{"create", "lay", "--from-oci", lay}, 0, `USER "4242" has no entry`, ""},
		{[]string{"create", "x", "--from-oci", lay, "--insecure-registry"}, 2, "", "usage"},
		{[]string{"create", "x", "--from-oci", lay, "--from-dir", lay}, 2, "", "usage"},
		{[]string{"create", "typo", "--from-oci", lay, "--allow-syscall", "kcmpp"}, 1, "", `--allow-syscall: seccomp: unknown syscall "kcmpp"`},
		{[]string{"create", "extra", "--from-oci", lay, "--allow-syscall", "kcmp,userfaultfd"}, 0, "its sandboxes may also call: kcmp, userfaultfd", ""},
		{[]string{"inspect", "typo"}, 1, "", "not found"}, // refused before the import
		{[]string{"inspect", "extra"}, 0, `"syscalls": [`, ""},
		{[]string{"ls"}, 0, "user=app workdir=/work env=1 cmd=/bin/hello", ""},
		{[]string{"inspect", "nope"}, 1, "", "not found"},
	} {
		args := append(append([]string{"template"}, tc.args...), "--data-dir", data)
		code, out, errOut := runCube(t, args...)
		if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("cube %s: exit %d, stdout %q, stderr %q; want exit %d, stdout ~ %q, stderr ~ %q",
				strings.Join(args, " "), code, out, errOut, tc.code, tc.stdout, tc.stderr)
		}
	}
	code, out, errOut := runCube(t, "template", "inspect", "web", "--data-dir", data)
	var got template.Template
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("inspect: exit %d %q %q", code, out, errOut)
	}
	if d := got.Defaults; d == nil || d.User != "app" || d.Workdir != "/work" || d.Env["GREETING"] != "hi" || len(d.Cmd) != 1 {
		t.Errorf("inspect defaults %+v", got.Defaults)
	}
}
