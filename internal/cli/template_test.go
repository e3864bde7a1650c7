package cli

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cube-dev/cube/internal/imagetest"
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
	return imagetest.Image(t, v1.Config{Env: []string{"GREETING=hi"}, WorkingDir: "/work", User: user, Cmd: []string{"/bin/hello"}}, buf.Bytes())
}

func TestTemplateCreateFromImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an import keeps file owners")
	}
	clearEnv(t)
	registry := imagetest.NewRegistry(t)
	host := registry.Host
	registry.Push(t, "app:1", cliTestImage(t, "app"))
	lay := imagetest.Layout(t, cliTestImage(t, "4242"))
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
