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
// cliTestImage is an image whose CMD is /bin/hello, with a /bin/sh or not.
func cliTestImage(t *testing.T, user string, shell bool) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n",
		"bin/hello":  "hello",
	}
	if shell {
		files["bin/sh"] = "a shell"
	}
	for name, body := range files {
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
	registry.Push(t, "app:1", cliTestImage(t, "app", true))
	lay := imagetest.Layout(t, cliTestImage(t, "4242", false))
	data := t.TempDir()

	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"create", "web", "--from-image", host + "/app:1"}, 1, "", "--insecure-registry"},
		{[]string{"create", "web", "--from-image", host + "/app:1", "--insecure-registry"}, 0, "start command: /bin/hello\n", ""},
		{[]string{"create", "webready", "--from-image", host + "/app:1", "--insecure-registry", "--ready-cmd", "test -e /tmp/up"}, 0, "ready command: test -e /tmp/up\n", ""},
		{[]string{"create", "webnone", "--from-image", host + "/app:1", "--insecure-registry", "--start-cmd", "none"}, 0, "template webnone registered", ""},
		{[]string{"create", "webnone2", "--from-image", host + "/app:1", "--insecure-registry", "--start-cmd", "none", "--ready-cmd", "true"}, 2, "", "--ready-cmd waits for a start command"},
		{[]string{"create", "dirready", "--from-dir", t.TempDir(), "--ready-cmd", "true"}, 2, "", "--ready-cmd waits for a start command"},
		{[]string{"create", "own", "--from-oci", "LAYOUT", "--start-cmd", "sleep 'infinity'"}, 0, "start command: sleep 'infinity'\n", ""},
		{[]string{"create", "web2", "--from-image", host + "/nothing:1", "--insecure-registry"}, 1, "", "not found"},
		{[]string{"create", "lay", "--from-oci", lay}, 0, "no /bin/sh to run its ENTRYPOINT and CMD (/bin/hello)", ""},
		{[]string{"create", "lay2", "--from-oci", lay}, 0, `USER "4242" has no entry`, ""},
		{[]string{"create", "x", "--from-oci", lay, "--insecure-registry"}, 2, "", "usage"},
		{[]string{"create", "x", "--from-oci", lay, "--from-dir", lay}, 2, "", "usage"},
		{[]string{"create", "typo", "--from-oci", lay, "--allow-syscall", "kcmpp"}, 1, "", `--allow-syscall: seccomp: unknown syscall "kcmpp"`},
		{[]string{"create", "extra", "--from-oci", lay, "--allow-syscall", "kcmp,userfaultfd"}, 0, "its sandboxes may also call: kcmp, userfaultfd", ""},
		{[]string{"inspect", "typo"}, 1, "", "not found"}, // refused before the import
		{[]string{"inspect", "extra"}, 0, `"syscalls": [`, ""},
		{[]string{"ls"}, 0, "user=app workdir=/work env=1 cmd=/bin/hello", ""},
		{[]string{"inspect", "nope"}, 1, "", "not found"},
	} {
		for i, a := range tc.args {
			if a == "LAYOUT" {
				tc.args[i] = lay
			}
		}
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
	if d := got.Defaults; d == nil || d.User != "app" || d.Workdir != "/work" || d.Env["GREETING"] != "hi" || len(d.Cmd) != 1 ||
		d.StartCmd != "/bin/hello" || d.ReadyCmd != "" {
		t.Errorf("inspect defaults %+v", got.Defaults)
	}
	// Recorded for the cubelet's start step: none asked, none without a shell.
	for name, want := range map[string][2]string{"webready": {"/bin/hello", "test -e /tmp/up"}, "webnone": {}, "lay": {}, "own": {"sleep 'infinity'", ""}} {
		code, out, errOut := runCube(t, "template", "inspect", name, "--data-dir", data)
		var got template.Template
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
			t.Fatalf("inspect %s: exit %d %q %q", name, code, out, errOut)
		}
		if d := got.Defaults; d == nil || d.StartCmd != want[0] || d.ReadyCmd != want[1] {
			t.Errorf("%s: start and ready commands %+v, want %q", name, got.Defaults, want)
		}
	}
}
