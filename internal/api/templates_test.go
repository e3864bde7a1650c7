package api

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// noNodes is the sandbox side of a control plane without any node: every
// build sandbox create is refused as unavailable. The handler tests need no
// sandbox; the lead's e2e test runs builds end to end.
type noNodes struct{}

func (noNodes) CreateBuildSandbox(context.Context, string, int, int) (string, error) {
	return "", errdefs.ErrUnavailable
}
func (noNodes) Envd(context.Context, string) (*http.Client, string, string, error) {
	return nil, "", "", errdefs.ErrNotFound
}
func (noNodes) CommitSandbox(context.Context, nodeproto.CommitRequest) error {
	return errdefs.ErrUnavailable
}
func (noNodes) KillSandbox(context.Context, string) error { return errdefs.ErrNotFound }

const testMaxUpload = 64 << 10

// newTemplatesEnv serves cube-api with a real build service over a real
// SQLite store and a template registry holding `base`.
func newTemplatesEnv(t *testing.T) (*env, *template.Registry) {
	t.Helper()
	ctx := context.Background()
	st, keys := openKeyStore(t, "test")
	dir := t.TempDir()
	reg := &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
	for _, name := range []string{"base", templatebuild.CachePrefix + "0123456789abcdef01234567"} {
		if _, err := reg.Register(ctx, name, template.Meta{Source: "test"}, func(ctx context.Context, rootfs string) error {
			return os.WriteFile(filepath.Join(rootfs, "marker"), nil, 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := templatebuild.New(ctx, templatebuild.Config{Store: st, Sandboxes: noNodes{}, Templates: templatebuild.RegistryTemplates{Registry: reg},
		FilesDir: filepath.Join(dir, "template-files"), Logger: logger, MaxUploadBytes: testMaxUpload})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	srv := httptest.NewServer(New(nil, st, logger, WithTemplateBuilds(svc)))
	t.Cleanup(srv.Close)
	return &env{t: t, srv: srv, key: keys[0], st: st}, reg
}

func tarGz(t *testing.T, name, body string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(body))
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// put sends an upload as the SDK does: no API key, exact Content-Length.
func put(t *testing.T, url string, body []byte) resp {
	t.Helper()
	req, err := http.NewRequest("PUT", url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// The build request, upload and start sequence of SDK 2.51.0 (wire doc §0),
// with its unhappy paths.
func TestTemplateBuildRoutes(t *testing.T) {
	e, _ := newTemplatesEnv(t)
	// JSON bodies arrive chunked.
	req, _ := http.NewRequest("POST", e.srv.URL+"/v3/templates", io.MultiReader(strings.NewReader(`{"name":"my-tpl","cpuCount":2,"memoryMB":1024}`)))
	req.Header.Set("X-API-Key", e.key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var created buildRequestedJSON
	r := resp{status: res.StatusCode, body: body}
	if r.status != http.StatusAccepted {
		t.Fatalf("request build: %d %s", r.status, body)
	}
	r.json(t, &created)
	if created.TemplateID != "my-tpl" || len(created.BuildID) != 36 || strings.Join(created.Names, ",") != "my-tpl" ||
		strings.Join(created.Aliases, ",") != "my-tpl" || strings.Join(created.Tags, ",") != "default" || !strings.Contains(string(body), `"public":false`) {
		t.Fatalf("request build answer %s", body)
	}
	var again buildRequestedJSON
	if r := e.do("POST", "/v3/templates", `{"name":"my-tpl:default"}`); r.status != http.StatusAccepted {
		t.Fatalf("second request: %d %s", r.status, r.body)
	} else if r.json(t, &again); again.TemplateID != "my-tpl" || again.BuildID == created.BuildID {
		t.Fatalf("second request %+v", again)
	}
	for body, has := range map[string]string{
		`{"name":"my-tpl:Not A Tag"}`:      "must match",
		`{"name":"my-tpl","tags":["a b"]}`: "must match",
		`{}`:                               "empty",
		`{"name":"UPPER and spaces"}`:      "1-63 characters",
		`{"name":"x","cpuCount":-1}`:       "negative",
		`{"name":`:                         "malformed",
		`{"name":"buildcache-0123456789abcdef01234"}`: "reserved",
	} {
		if r := e.do("POST", "/v3/templates", body); r.status != http.StatusBadRequest || r.errCode(t) != 400 || !strings.Contains(string(r.body), has) {
			t.Errorf("%s: %d %s; want 400 with %q", body, r.status, r.body, has)
		}
	}

	// A waiting build's status: arrays, never null; no reason.
	statusPath := "/templates/my-tpl/builds/" + created.BuildID + "/status"
	r = e.do("GET", statusPath+"?logsOffset=0", "")
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"status":"waiting","logEntries":[],"logs":[]`) || strings.Contains(string(r.body), "reason") {
		t.Fatalf("waiting status: %d %s", r.status, r.body)
	}
	if r := e.do("GET", statusPath+"?logsOffset=-1", ""); r.status != http.StatusBadRequest {
		t.Errorf("negative offset: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/templates/other/builds/"+created.BuildID+"/status", ""); r.status != http.StatusNotFound || r.errCode(t) != 404 {
		t.Errorf("status under another template: %d %s", r.status, r.body)
	}

	// Upload links: absolute, self-authorizing; present once stored.
	hash := strings.Repeat("4b", 32)
	if r := e.do("GET", "/templates/nope/files/"+hash, ""); r.status != http.StatusNotFound {
		t.Errorf("files of an unknown template: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/templates/my-tpl/files/NOTAHASH", ""); r.status != http.StatusBadRequest {
		t.Errorf("bad hash: %d %s", r.status, r.body)
	}
	var link fileLinkJSON
	if r := e.do("GET", "/templates/my-tpl/files/"+hash, ""); r.status != http.StatusCreated {
		t.Fatalf("file link: %d %s", r.status, r.body)
	} else {
		r.json(t, &link)
	}
	if link.Present || !strings.HasPrefix(link.URL, e.srv.URL+"/cube/v1/template-files/"+hash+"?") {
		t.Fatalf("file link %+v", link)
	}
	archive := tarGz(t, "hello.txt", "hello world\n")
	if r := put(t, strings.Replace(link.URL, "token=", "token=00", 1), archive); r.status != http.StatusForbidden || r.errCode(t) != 403 {
		t.Errorf("wrong token: %d %s", r.status, r.body)
	}
	if r := put(t, e.srv.URL+"/cube/v1/template-files/"+hash, archive); r.status != http.StatusUnauthorized {
		t.Errorf("no token: %d %s", r.status, r.body)
	}
	other := strings.Repeat("cd", 32)
	if r := put(t, strings.Replace(link.URL, hash, other, 1), archive); r.status != http.StatusForbidden {
		t.Errorf("token of another hash: %d %s", r.status, r.body)
	}
	if r := put(t, link.URL, bytes.Repeat([]byte("x"), testMaxUpload+1)); r.status != http.StatusRequestEntityTooLarge {
		t.Errorf("oversize: %d %s", r.status, r.body)
	}
	if r := put(t, link.URL, []byte(strings.Repeat("not a tar ", 100))); r.status != http.StatusBadRequest {
		t.Errorf("not a tar: %d %s", r.status, r.body)
	}
	if r := put(t, link.URL, archive); r.status != http.StatusOK || r.header.Get("Content-Length") != "0" {
		t.Fatalf("upload: %d %q %s", r.status, r.header.Get("Content-Length"), r.body)
	}
	if r := e.do("GET", "/templates/my-tpl/files/"+hash, ""); !strings.Contains(string(r.body), `"present":true`) {
		t.Fatalf("after upload: %s", r.body)
	}

	// Start: bad steps are refused up front, nothing runs.
	startPath := "/v2/templates/my-tpl/builds/" + created.BuildID
	for body, has := range map[string]string{
		`{"steps":[{"type":"FROB","args":[],"force":false}],"force":false,"fromTemplate":"base"}`:                                           "Cube supports RUN, COPY, ENV, WORKDIR and USER",
		`{"steps":[{"type":"COPY","args":["a","/a","",""],"force":false,"filesHash":"` + other + `"}],"force":false,"fromTemplate":"base"}`: "never uploaded",
		`{"steps":[],"force":false,"fromImage":"ubuntu:22.04"}`:                                                                             "cube template create NAME --from-image ubuntu:22.04",
		`{"steps":[],"force":false,"fromTemplate":"nope"}`:                                                                                  "does not exist",
	} {
		if r := e.do("POST", startPath, body); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), has) {
			t.Errorf("%s: %d %s; want 400 with %q", body, r.status, r.body, has)
		}
	}
	if r := e.do("POST", "/v2/templates/my-tpl/builds/nope", `{"steps":[],"force":false}`); r.status != http.StatusNotFound {
		t.Errorf("unknown build: %d %s", r.status, r.body)
	}
	good := `{"startCmd":"x","steps":[{"type":"COPY","args":["hello.txt","/home/user/","",""],"force":false,"forceUpload":true,"filesHash":"` + hash +
		`"}],"force":false,"fromImage":"e2bdev/base"}`
	if r := e.do("POST", startPath, good); r.status != http.StatusAccepted || r.header.Get("Content-Length") != "0" {
		t.Fatalf("start: %d %q %s", r.status, r.header.Get("Content-Length"), r.body)
	}
	if r := e.do("POST", startPath, good); r.status != http.StatusConflict {
		t.Errorf("second start: %d %s", r.status, r.body)
	}

	// No node runs it: the build fails; the SDK's offset loop drains the
	// logs and every error answer carries the reason.
	var info templatebuild.BuildInfo
	offset, deadline := 0, time.Now().Add(30*time.Second)
	for {
		r := e.do("GET", statusPath+"?logsOffset="+strconv.Itoa(offset), "")
		if r.status != http.StatusOK {
			t.Fatalf("status: %d %s", r.status, r.body)
		}
		info = templatebuild.BuildInfo{}
		r.json(t, &info)
		offset += len(info.LogEntries)
		if info.Status == "error" && len(info.LogEntries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("build did not end: %s", r.body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if info.Reason == nil || info.Reason.Step != "base" || !strings.Contains(info.Reason.Message, "start the build sandbox") || offset < 2 {
		t.Fatalf("failed build: %+v after %d entries", info, offset)
	}
}

// List, alias, tags and delete, as the CLI and SDK call them.
func TestTemplateCatalogRoutes(t *testing.T) {
	e, reg := newTemplatesEnv(t)
	r := e.do("GET", "/templates", "")
	var list []map[string]any
	r.json(t, &list)
	if r.status != http.StatusOK || len(list) != 1 || list[0]["templateID"] != "base" {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	for _, field := range []string{"aliases", "buildCount", "buildID", "buildStatus", "cpuCount", "createdAt", "createdBy", "diskSizeMB",
		"envdVersion", "lastSpawnedAt", "memoryMB", "names", "public", "spawnCount", "templateID", "updatedAt"} {
		if _, ok := list[0][field]; !ok {
			t.Errorf("list entry lacks required %q: %s", field, r.body)
		}
	}
	if r := e.do("GET", "/templates?teamID=team-123", ""); r.status != http.StatusOK {
		t.Errorf("list with teamID: %d", r.status)
	}
	if r := e.do("GET", "/templates", "", "X-API-Key", ""); r.status != http.StatusUnauthorized {
		t.Errorf("list without key: %d", r.status)
	}
	if r := e.do("GET", "/templates/aliases/base", ""); r.status != http.StatusOK || string(bytes.TrimSpace(r.body)) != `{"templateID":"base","public":false}` {
		t.Errorf("alias: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/templates/aliases/nope", ""); r.status != http.StatusNotFound || r.errCode(t) != 404 {
		t.Errorf("unknown alias: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/templates/base/tags", ""); r.status != http.StatusOK || !strings.Contains(string(r.body), `"tag":"default"`) {
		t.Errorf("tags: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/templates/base/other", ""); r.status != http.StatusNotFound {
		t.Errorf("unknown sub-route: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/templates/nope", ""); r.status != http.StatusNotFound || r.errCode(t) != 404 {
		t.Errorf("delete unknown: %d %s", r.status, r.body)
	}
	if r := e.do("DELETE", "/templates/base", ""); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if _, err := reg.Get(context.Background(), "base"); err == nil {
		t.Fatal("base still registered")
	}
	if r := e.do("GET", "/templates", ""); r.status != http.StatusOK || string(bytes.TrimSpace(r.body)) != "[]" {
		t.Errorf("empty list: %d %s", r.status, r.body)
	}
}

// Without a build service the routes stay unknown.
func TestTemplateRoutesNeedService(t *testing.T) {
	st, keys := openKeyStore(t, "test")
	srv := httptest.NewServer(New(nil, st, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer srv.Close()
	e := &env{t: t, srv: srv, key: keys[0]}
	for _, p := range []string{"/templates", "/templates/aliases/base"} {
		if r := e.do("GET", p, ""); r.status != http.StatusNotFound || !strings.Contains(string(r.body), "no route") {
			t.Errorf("%s: %d %s", p, r.status, r.body)
		}
	}
}
