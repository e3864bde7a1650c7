package templatebuild

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/template"
)

func TestParseName(t *testing.T) {
	for _, c := range []struct {
		in, want, errHas string
	}{
		{in: "my-tpl", want: "my-tpl"},
		{in: "  My-Tpl ", want: "my-tpl"},
		{in: "my-tpl:default", want: "my-tpl"},
		{in: "my_tpl.v2", want: "my_tpl.v2"},
		{in: "my-tpl:v1", want: "my-tpl"},
		{in: "my-tpl:0f8fad5b-d9cb-469f-a165-70867728950e", errHas: "cannot be a UUID"},
		{in: "my-tpl:Bad Tag", errHas: "must match"},
		{in: "team/my-tpl", errHas: "namespaced"},
		{in: "", errHas: "empty"},
		{in: "-x", errHas: "1-63 characters"},
		{in: strings.Repeat("a", 64), errHas: "1-63 characters"},
	} {
		got, err := ParseName(c.in)
		if c.errHas != "" {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("ParseName(%q) = %q, %v; want an invalid-argument error with %q", c.in, got, err, c.errHas)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseName(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestParseBuildName(t *testing.T) {
	name, tags, err := ParseBuildName("web", nil)
	if err != nil || name != "web" || len(tags) != 1 || tags[0] != "default" {
		t.Fatalf("no tags: %q %q %v", name, tags, err)
	}
	if _, tags, err := ParseBuildName("web:default", []string{"default", " DEFAULT "}); err != nil || len(tags) != 1 {
		t.Fatalf("default tags: %q %v", tags, err)
	}
	// The name's tag and the extra ones, deduplicated in order; no
	// default unless asked for.
	if _, tags, err := ParseBuildName("web:V1", []string{"prod", "v1", " Stable "}); err != nil || strings.Join(tags, ",") != "v1,prod,stable" {
		t.Fatalf("tags: %q %v", tags, err)
	}
	if _, tags, err := ParseBuildName("web", []string{"prod", "default"}); err != nil || strings.Join(tags, ",") != "prod,default" {
		t.Fatalf("extra tags: %q %v", tags, err)
	}
	if _, tags, err := ParseBuildName("web", []string{}); err != nil || strings.Join(tags, ",") != "default" {
		t.Fatalf("empty extra tags: %q %v", tags, err)
	}
	if _, _, err := ParseBuildName("web", []string{"bad tag"}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `"bad tag"`) {
		t.Fatalf("bad extra tag: %v", err)
	}
	if _, _, err := ParseBuildName(BuildTemplate("0f8fad5b-d9cb-469f-a165-70867728950e"), nil); !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "reserved for the results of tagged builds") {
		t.Fatalf("per-build template name: %v", err)
	}
	if _, _, err := ParseBuildName("buildcache-0123", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("reserved name: %v", err)
	}
}

func TestParseParent(t *testing.T) {
	creds := json.RawMessage(`{"type":"registry","username":"u","password":"p"}`)
	for _, c := range []struct {
		spec   BuildSpec
		want   Parent
		errHas string
	}{
		{spec: BuildSpec{}, want: Parent{Template: "base"}},
		{spec: BuildSpec{FromImage: "e2bdev/base"}, want: Parent{Template: "base"}},
		{spec: BuildSpec{FromImage: " e2bdev/base:latest "}, want: Parent{Template: "base"}},
		{spec: BuildSpec{FromImage: "docker.io/e2bdev/base"}, want: Parent{Template: "base"}},
		{spec: BuildSpec{FromImage: "index.docker.io/e2bdev/base:latest", FromImageRegistry: creds}, want: Parent{Template: "base"}},
		{spec: BuildSpec{FromTemplate: "web"}, want: Parent{Template: "web"}},
		{spec: BuildSpec{FromTemplate: "web:default"}, want: Parent{Template: "web"}},
		{spec: BuildSpec{FromTemplate: " Web:V2"}, want: Parent{Template: "web:v2"}}, // StartBuild resolves the tag
		{spec: BuildSpec{FromTemplate: "web:bad tag"}, errHas: "must match"},
		{spec: BuildSpec{FromImage: "ubuntu", FromTemplate: "web"}, errHas: "not both"},
		// Any other image is imported by the build.
		{spec: BuildSpec{FromImage: "ubuntu:22.04"}, want: Parent{Image: "ubuntu:22.04"}},
		{spec: BuildSpec{FromImage: "e2bdev/base:other"}, want: Parent{Image: "e2bdev/base:other"}},
		{spec: BuildSpec{FromImage: "127.0.0.1:5000/app@sha256:" + strings.Repeat("a", 64)},
			want: Parent{Image: "127.0.0.1:5000/app@sha256:" + strings.Repeat("a", 64)}},
		{spec: BuildSpec{FromImage: "ghcr.io/org/app:1", FromImageRegistry: creds},
			want: Parent{Image: "ghcr.io/org/app:1", Auth: &RegistryAuth{Username: "u", Password: "p"}}},
		{spec: BuildSpec{FromImage: "ghcr.io/org/app:1", FromImageRegistry: json.RawMessage("null")}, want: Parent{Image: "ghcr.io/org/app:1"}},
		// Refused at once: malformed references, unsupported credentials.
		{spec: BuildSpec{FromImage: "Ubuntu:22.04"}, errHas: "not a valid image reference"},
		{spec: BuildSpec{FromImage: "ubuntu:bad tag"}, errHas: "not a valid image reference"},
		{spec: BuildSpec{FromImage: "app@sha256:short"}, errHas: "not a valid image reference"},
		{spec: BuildSpec{FromImage: "ubuntu", FromImageRegistry: json.RawMessage(`{"type":"aws","awsAccessKeyId":"AK","awsSecretAccessKey":"SK","awsRegion":"us-east-1"}`)},
			errHas: `type "aws" (fromAWSRegistry) is not supported`},
		{spec: BuildSpec{FromImage: "ubuntu", FromImageRegistry: json.RawMessage(`{"type":"gcp","serviceAccountJson":"{}"}`)},
			errHas: `type "gcp" (fromGCPRegistry) is not supported`},
		{spec: BuildSpec{FromImage: "ubuntu", FromImageRegistry: json.RawMessage(`{"type":"azure"}`)}, errHas: `type "azure" is unknown`},
		{spec: BuildSpec{FromImage: "ubuntu", FromImageRegistry: json.RawMessage(`{"type":"registry","username":"u"}`)}, errHas: "username and a password"},
		{spec: BuildSpec{FromImage: "ubuntu", FromImageRegistry: json.RawMessage(`[1]`)}, errHas: "malformed fromImageRegistry"},
	} {
		got, err := ParseParent(c.spec)
		if c.errHas != "" {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("%+v: %+v, %v; want error with %q", c.spec, got, err, c.errHas)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%+v: %+v, %v; want %+v", c.spec, got, err, c.want)
		}
	}
}

func TestImageTemplate(t *testing.T) {
	d1, d2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	n1 := ImageTemplate(d1)
	if n1 != ImageTemplate(d1) || n1 == ImageTemplate(d2) || !IsImageTemplate(n1) || len(n1) != len(ImagePrefix)+16 {
		t.Fatalf("ImageTemplate: %q %q", n1, ImageTemplate(d2))
	}
	if err := template.ValidateName(n1); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"image-processor", "image-0123", "image-0123456789abcdeg", "my-image-0123456789abcdef"} {
		if IsImageTemplate(n) {
			t.Errorf("IsImageTemplate(%q)", n)
		}
	}
	if _, _, err := ParseBuildName(n1, nil); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "reserved for images") {
		t.Fatalf("build named like an image template: %v", err)
	}
	if _, _, err := ParseBuildName("image-processor", nil); err != nil {
		t.Fatal(err)
	}
}

// The body SDK 2.51.0 sent in the captured run (wire doc appendix A),
// plus the client-only keys a COPY may carry.
const sdkBody = `{"startCmd":"python3 -m http.server 8000","readyCmd":"[ -n \"$(ss -Htuln sport = :8000)\" ]",
 "steps":[
  {"type":"RUN","args":["apt-get update && apt-get install -y curl","root"],"force":false},
  {"type":"RUN","args":["echo default-user"],"force":false},
  {"type":"COPY","args":["hello.txt","/home/user/hello.txt","user","0644"],"force":true,"forceUpload":true,"resolveSymlinks":false,"gzip":false,
   "filesHash":"4be0dee33eeea6ce62a00353cc48147d022985da66b23bb353beee90daf72fb1"},
  {"type":"ENV","args":["FOO","bar","HELLO","world with spaces"],"force":false},
  {"type":"WORKDIR","args":["/home/user/app"],"force":false},
  {"type":"USER","args":["user"],"force":false}],
 "force":false,"fromTemplate":"base","somethingNew":{"x":1}}`

func TestDecodeSpec(t *testing.T) {
	spec, err := DecodeSpec([]byte(sdkBody))
	if err != nil {
		t.Fatal(err)
	}
	if spec.FromTemplate != "base" || spec.StartCmd != "python3 -m http.server 8000" || !strings.Contains(spec.ReadyCmd, "ss -Htuln") ||
		len(spec.Steps) != 6 || !spec.Steps[2].Force || spec.Steps[2].FilesHash[:4] != "4be0" || spec.Steps[1].Args[0] != "echo default-user" {
		t.Fatalf("decoded %+v", spec)
	}
	if empty, err := DecodeSpec(nil); err != nil || empty.Steps == nil || len(empty.Steps) != 0 {
		t.Fatalf("empty body: %+v, %v", empty, err)
	}
	hash := strings.Repeat("a", 64)
	for _, c := range []struct{ body, errHas string }{
		{`{"steps":[{"type":"ADD","args":["x","y"]}]}`, `step 1 (ADD): unknown step type "ADD"`},
		{`{"steps":[{"type":"RUN","args":[]}]}`, "RUN takes"},
		{`{"steps":[{"type":"RUN","args":["true","bad user!"]}]}`, "not a valid user name"},
		{`{"steps":[{"type":"COPY","args":["a","/b","",""]}]}`, "needs filesHash"},
		{`{"steps":[{"type":"COPY","args":["a","/b","",""],"filesHash":"ABC"}]}`, "needs filesHash"},
		{`{"steps":[{"type":"COPY","args":["../a","/b","",""],"filesHash":"` + hash + `"}]}`, "leaves the build context"},
		{`{"steps":[{"type":"COPY","args":["a","/b","x;y",""],"filesHash":"` + hash + `"}]}`, "owner"},
		{`{"steps":[{"type":"COPY","args":["a","/b","","999"],"filesHash":"` + hash + `"}]}`, "mode"},
		{`{"steps":[{"type":"ENV","args":["A"]}]}`, "pairs"},
		{`{"steps":[{"type":"ENV","args":["A B","1"]}]}`, "not a valid variable name"},
		{`{"steps":[{"type":"WORKDIR","args":[""]}]}`, "WORKDIR takes"},
		{`{"steps":[{"type":"USER","args":["Root;rm"]}]}`, "USER takes"},
		{`{"steps":[{"type":"RUN","args":["true"]},{"type":"RUN"}]}`, "step 2 (RUN)"},
		{`{"steps":`, "malformed"},
	} {
		if _, err := DecodeSpec([]byte(c.body)); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.errHas) {
			t.Errorf("%s: %v; want an invalid-argument error with %q", c.body, err, c.errHas)
		}
	}
}

func TestCacheKeys(t *testing.T) {
	run := func(cmd string) Step { return Step{Type: StepRun, Args: []string{cmd}} }
	a := cacheKeys("p1", []Step{run("a"), run("b"), run("c")})
	b := cacheKeys("p1", []Step{run("a"), run("b"), run("changed")})
	c := cacheKeys("p2", []Step{run("a")})
	if len(a) != 4 || a[0] != b[0] || a[1] != b[1] || a[2] != b[2] || a[3] == b[3] {
		t.Fatalf("a shared prefix must share keys, the changed step must not:\n%q\n%q", a, b)
	}
	if c[0] == a[0] || c[1] == a[1] {
		t.Fatal("another parent must change every key")
	}
	// Args are not concatenated ambiguously, and files hashes count.
	x := cacheKeys("p", []Step{{Type: StepRun, Args: []string{"a b"}}})
	y := cacheKeys("p", []Step{{Type: StepRun, Args: []string{"a", "b"}}})
	f1 := cacheKeys("p", []Step{{Type: StepCopy, Args: []string{"a", "/b"}, FilesHash: "1"}})
	f2 := cacheKeys("p", []Step{{Type: StepCopy, Args: []string{"a", "/b"}, FilesHash: "2"}})
	if x[1] == y[1] || f1[1] == f2[1] {
		t.Fatal("distinct steps share a key")
	}
	// force is not part of the key: it only decides whether the cache is read.
	forced := cacheKeys("p1", []Step{{Type: StepRun, Args: []string{"a"}, Force: true}})
	if forced[1] != a[1] {
		t.Fatal("force changed the key")
	}
	if n := cacheName(a[1]); n != CachePrefix+a[1][:24] || len(n) > 63 {
		t.Fatalf("cache name %q", n)
	}
	p1 := parentKey(TemplateInfo{Name: "base", Digest: "sha256:1"})
	p2 := parentKey(TemplateInfo{Name: "base", Digest: "sha256:1", User: "root"})
	if p1 == p2 {
		t.Fatal("the parent's defaults must be part of its key")
	}
}
