package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/proxy"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatebuild"
)

// regNode is a listenNode whose templates are those of a real registry.
type regNode struct {
	*listenNode
	reg *template.Registry
}

func (n regNode) Template(ctx context.Context, name string) (master.TemplateInfo, error) {
	t, err := n.reg.Get(ctx, name)
	if err != nil {
		return master.TemplateInfo{}, err
	}
	return master.TemplateInfo{Name: t.Name, CPUCount: 1, MemoryMB: 512, DiskSizeMB: 1024}, nil
}

// newTagsEnv serves cube-api with a master (sandboxes are local HTTP
// servers) and a build service over one SQLite store and registry.
func newTagsEnv(t *testing.T) (*env, *template.Registry) {
	t.Helper()
	ctx := context.Background()
	st, keys := openKeyStore(t, "test")
	dir := t.TempDir()
	reg := &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := templatebuild.New(ctx, templatebuild.Config{Store: st, Sandboxes: noNodes{}, Templates: templatebuild.RegistryTemplates{Registry: reg},
		FilesDir: filepath.Join(dir, "template-files"), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	node := regNode{listenNode: newListenNode(), reg: reg}
	m := master.New(st, node, master.Config{Domain: "cube.test", Logger: logger})
	srv := httptest.NewServer(proxy.New(m, New(m, st, logger, WithTemplateBuilds(svc)), "cube.test"))
	t.Cleanup(func() {
		srv.Close()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		m.Shutdown(sctx, true)
		node.closeAll()
	})
	return &env{t: t, srv: srv, key: keys[0], st: st, m: m}, reg
}

func register(t *testing.T, reg *template.Registry, name string) {
	t.Helper()
	if _, err := reg.Register(context.Background(), name, template.Meta{Source: "test"}, func(ctx context.Context, rootfs string) error {
		return os.WriteFile(filepath.Join(rootfs, "marker"), []byte(name), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
}

// Tags as SDK 2.51.0 calls them: build names with tags, assignTags,
// removeTags, getTags, exists, Sandbox.create of name:tag, list, delete.
func TestTemplateTagRoutes(t *testing.T) {
	e, reg := newTagsEnv(t)
	ctx := context.Background()
	var created buildRequestedJSON
	if r := e.do("POST", "/v3/templates", `{"name":"web:V1","tags":["prod","v1"]}`); r.status != http.StatusAccepted {
		t.Fatalf("request a tagged build: %d %s", r.status, r.body)
	} else if r.json(t, &created); created.TemplateID != "web" || strings.Join(created.Tags, ",") != "v1,prod" {
		t.Fatalf("tagged build answer %s", r.body)
	}
	// What a ready build of it leaves: web (an earlier untagged build)
	// and the tagged build's own template, with the tags pointing at it.
	register(t, reg, "base")
	register(t, reg, "web")
	v1 := templatebuild.BuildTemplate(created.BuildID)
	register(t, reg, v1)
	if _, err := e.st.PutTemplateTags(ctx, "web", []string{"v1", "prod"}, created.BuildID, v1); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.FinishTemplateBuild(ctx, created.BuildID, store.BuildReady, ""); err != nil {
		t.Fatal(err)
	}

	r := e.do("GET", "/templates/web/tags", "")
	var tags []tagJSON
	r.json(t, &tags)
	if r.status != http.StatusOK || len(tags) != 3 || tags[0].Tag != "default" || tags[1].Tag != "prod" || tags[2].Tag != "v1" ||
		tags[2].BuildID != created.BuildID || tags[2].CreatedAt.IsZero() {
		t.Fatalf("tags: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/templates/nope/tags", ""); r.status != http.StatusNotFound || r.errCode(t) != 404 {
		t.Errorf("tags of an unknown template: %d %s", r.status, r.body)
	}

	// assignTags: 201 with the build; unknown tag 404; no tags 400.
	r = e.do("POST", "/templates/tags", `{"target":"web:v1","tags":["stable"]}`)
	if r.status != http.StatusCreated || strings.TrimSpace(string(r.body)) != `{"buildID":"`+created.BuildID+`","tags":["stable"]}` {
		t.Fatalf("assign: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/templates/tags", `{"target":"web:nope","tags":["x"]}`); r.status != http.StatusNotFound || r.errCode(t) != 404 ||
		!strings.Contains(string(r.body), `has no tag \"nope\"`) {
		t.Errorf("assign from an unknown tag: %d %s", r.status, r.body)
	}
	for body, status := range map[string]int{
		`{"target":"web:v1","tags":[]}`:         http.StatusBadRequest,
		`{"target":"web:v1","tags":["a b"]}`:    http.StatusBadRequest,
		`{"target":"nope:v1","tags":["x"]}`:     http.StatusNotFound,
		`{"target":"web:v1","tags":`:            http.StatusBadRequest,
		`{"target":"Bad Name","tags":["x"]}`:    http.StatusBadRequest,
		`{"target":"web:default","tags":["d"]}`: http.StatusCreated,
	} {
		if r := e.do("POST", "/templates/tags", body); r.status != status {
			t.Errorf("assign %s: %d %s; want %d", body, r.status, r.body, status)
		}
	}

	// exists (aliases) with tags.
	if r := e.do("GET", "/templates/aliases/web%3Astable", ""); r.status != http.StatusOK || !strings.Contains(string(r.body), `"templateID":"web"`) {
		t.Errorf("alias web:stable: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/templates/aliases/web%3Anope", ""); r.status != http.StatusNotFound {
		t.Errorf("alias web:nope: %d %s", r.status, r.body)
	}

	// Sandbox.create of a tag runs the tag's template, records the name
	// it was asked for and reports the template's name; an unknown tag is
	// a 404 naming the tags.
	var sb sandboxJSON
	if r := e.do("POST", "/sandboxes", `{"templateID":"web:stable"}`); r.status != http.StatusCreated {
		t.Fatalf("create web:stable: %d %s", r.status, r.body)
	} else if r.json(t, &sb); sb.TemplateID != "web" || sb.Alias != "web:stable" {
		t.Fatalf("sandbox of web:stable: %s", r.body)
	}
	if rec, err := e.st.GetSandbox(ctx, sb.SandboxID); err != nil || rec.TemplateID != v1 || rec.Alias != "web:stable" {
		t.Fatalf("record %+v %v", rec, err)
	}
	if r := e.do("POST", "/sandboxes", `{"templateID":"web:nope"}`); r.status != http.StatusNotFound || r.errCode(t) != 404 ||
		!strings.Contains(string(r.body), "its tags: d, default, prod, stable, v1") {
		t.Errorf("create web:nope: %d %s", r.status, r.body)
	}
	var plain sandboxJSON
	if r := e.do("POST", "/sandboxes", `{"templateID":"web"}`); r.status != http.StatusCreated {
		t.Fatalf("create web: %d %s", r.status, r.body)
	} else if r.json(t, &plain); plain.TemplateID != "web" || plain.Alias != "web" {
		t.Fatalf("sandbox of web: %s", r.body)
	}
	if r := e.do("POST", "/sandboxes", `{"templateID":"nothing"}`); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "not found") {
		t.Errorf("create of an unknown template (as before tags): %d %s", r.status, r.body)
	}

	// removeTags: 204; all or nothing; not the default.
	if r := e.do("DELETE", "/templates/tags", `{"name":"web","tags":["prod","d"]}`); r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("remove: %d %s", r.status, r.body)
	}
	for body, status := range map[string]int{
		`{"name":"web","tags":["prod"]}`:    http.StatusNotFound,
		`{"name":"web","tags":["default"]}`: http.StatusBadRequest,
		`{"name":"web:v1","tags":["v1"]}`:   http.StatusBadRequest,
		`{"name":"nope","tags":["v1"]}`:     http.StatusNotFound,
	} {
		if r := e.do("DELETE", "/templates/tags", body); r.status != status {
			t.Errorf("remove %s: %d %s; want %d", body, r.status, r.body, status)
		}
	}

	// The list shows web once, never a per-build template.
	var list []templateJSON
	r = e.do("GET", "/templates", "")
	r.json(t, &list)
	if r.status != http.StatusOK || len(list) != 2 || list[0].TemplateID != "base" || list[1].TemplateID != "web" {
		t.Fatalf("list: %d %s", r.status, r.body)
	}

	// Delete: whole templates only, refused while a tag's template runs.
	if r := e.do("DELETE", "/templates/web%3Av1", ""); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "removeTags") {
		t.Errorf("delete web:v1: %d %s", r.status, r.body)
	}
	kill := func(id string) {
		t.Helper()
		if r := e.do("DELETE", "/sandboxes/"+id, ""); r.status != http.StatusNoContent {
			t.Fatalf("kill %s: %d %s", id, r.status, r.body)
		}
	}
	kill(plain.SandboxID)
	if r := e.do("DELETE", "/templates/web", ""); r.status != http.StatusConflict || !strings.Contains(string(r.body), sb.SandboxID) {
		t.Fatalf("delete while in use: %d %s", r.status, r.body)
	}
	kill(sb.SandboxID)
	if r := e.do("DELETE", "/templates/web", ""); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	for _, name := range []string{"web", v1} {
		if _, err := reg.Get(ctx, name); err == nil {
			t.Errorf("%s stayed after the delete", name)
		}
	}
	if r := e.do("POST", "/sandboxes", `{"templateID":"web:v1"}`); r.status != http.StatusNotFound {
		t.Errorf("create of a deleted tag: %d %s", r.status, r.body)
	}
	// A template called "tags" is still deleted by DELETE /templates/tags
	// without a body.
	register(t, reg, "tags")
	if r := e.do("DELETE", "/templates/tags", ""); r.status != http.StatusNoContent {
		t.Fatalf("delete the template tags: %d %s", r.status, r.body)
	}
	if _, err := reg.Get(ctx, "tags"); err == nil {
		t.Error("template tags stayed")
	}
}

// A sandbox of a tag runs on the hidden per-build template the tag points
// at, but reports the template's name as its templateID (as E2B reports a
// template's id whatever build runs) and the name it was asked for as its
// alias: in the create answer, connect, GET /sandboxes/{id} and both lists,
// and the list's template filter finds it by that name. The record keeps
// the build template, which deletes of the template check.
func TestTagSandboxReportsTemplateName(t *testing.T) {
	e, reg := newTagsEnv(t)
	ctx := context.Background()
	build := func(name string) string {
		t.Helper()
		var b buildRequestedJSON
		if r := e.do("POST", "/v3/templates", `{"name":"`+name+`"}`); r.status != http.StatusAccepted {
			t.Fatalf("request a build of %s: %d %s", name, r.status, r.body)
		} else {
			r.json(t, &b)
		}
		return b.BuildID
	}
	// web:v1 and app's default tag point at per-build templates.
	webV1, appDefault := build("web:v1"), build("app")
	register(t, reg, "web")
	v1, appTpl := templatebuild.BuildTemplate(webV1), templatebuild.BuildTemplate(appDefault)
	for tpl, row := range map[string]struct{ name, tag, build string }{v1: {"web", "v1", webV1}, appTpl: {"app", "default", appDefault}} {
		register(t, reg, tpl)
		if _, err := e.st.PutTemplateTags(ctx, row.name, []string{row.tag}, row.build, tpl); err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.FinishTemplateBuild(ctx, row.build, store.BuildReady, ""); err != nil {
			t.Fatal(err)
		}
	}

	check := func(what string, got, want [2]string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: templateID, alias = %q; want %q", what, got, want)
		}
	}
	created := map[string]string{} // sandbox id -> the template it reports
	for ref, want := range map[string][2]string{
		"web:v1": {"web", "web:v1"}, "Web:V1": {"web", "Web:V1"}, "app": {"app", "app"}, "web": {"web", "web"},
	} {
		var sb sandboxJSON
		r := e.do("POST", "/v2/sandboxes", `{"templateID":"`+ref+`"}`)
		if r.status != http.StatusCreated {
			t.Fatalf("create %s: %d %s", ref, r.status, r.body)
		}
		r.json(t, &sb)
		check("create "+ref, [2]string{sb.TemplateID, sb.Alias}, want)
		created[sb.SandboxID] = want[0]

		var d detailJSON
		e.do("GET", "/sandboxes/"+sb.SandboxID, "").json(t, &d)
		check("GET "+ref, [2]string{d.TemplateID, d.Alias}, want)
		var c sandboxJSON
		e.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`).json(t, &c)
		check("connect "+ref, [2]string{c.TemplateID, c.Alias}, want)

		// The record keeps the template the sandbox runs on.
		rec, err := e.st.GetSandbox(ctx, sb.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		if wantRec := map[string]string{"web:v1": v1, "Web:V1": v1, "app": appTpl, "web": "web"}[ref]; rec.TemplateID != wantRec {
			t.Errorf("record of %s runs on %q; want %q", ref, rec.TemplateID, wantRec)
		}
	}

	list := func(path string) map[string]string {
		t.Helper()
		r := e.do("GET", path, "")
		var items []listedJSON
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		r.json(t, &items)
		out := map[string]string{}
		for _, it := range items {
			out[it.SandboxID] = it.TemplateID
		}
		return out
	}
	for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
		if got := list(path); len(got) != len(created) {
			t.Errorf("%s: %v; want %v", path, got, created)
		} else {
			for id, tpl := range created {
				if got[id] != tpl {
					t.Errorf("%s: %s reports %q; want %q", path, id, got[id], tpl)
				}
			}
		}
	}
	count := func(m map[string]string, tpl string) (n int) {
		for _, v := range m {
			if v == tpl {
				n++
			}
		}
		return n
	}
	for filter, want := range map[string]int{"web": 3, "app": 1, "web:v1": 1, v1: 2, "nope": 0, "we": 0} {
		got := list("/v2/sandboxes?template=" + url.QueryEscape(filter))
		if len(got) != want {
			t.Errorf("?template=%s: %v; want %d sandboxes", filter, got, want)
		}
		if filter == "web" && count(got, "web") != 3 {
			t.Errorf("?template=web: %v", got)
		}
	}
	// What in-use checks ask (the template a sandbox runs on) is unchanged:
	// web itself runs one sandbox, its build of v1 two.
	for tpl, want := range map[string]int{"web": 1, v1: 2, appTpl: 1} {
		if p, err := e.st.ListSandboxes(ctx, store.ListFilter{Template: tpl}); err != nil || len(p.Sandboxes) != want {
			t.Errorf("sandboxes running on %s: %d, %v; want %d", tpl, len(p.Sandboxes), err, want)
		}
	}
	if r := e.do("DELETE", "/templates/app", ""); r.status != http.StatusConflict {
		t.Errorf("delete app while its default tag's template runs: %d %s", r.status, r.body)
	}
}
