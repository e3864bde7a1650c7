package templatebuild

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
)

// buildNamed runs a build without steps (no envd needed: the build sandbox
// is created, the result committed) of name with extra tags, to its end.
func (f *fixture) buildNamed(t *testing.T, name string, tags []string, from string) RequestedBuild {
	t.Helper()
	ctx := context.Background()
	req, err := f.svc.RequestBuild(ctx, BuildRequest{Name: name, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.StartBuild(ctx, req.TemplateID, req.BuildID, BuildSpec{FromTemplate: from, Steps: []Step{}}); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	if info, logs := f.wait(t, req.TemplateID, req.BuildID); info.Status != "ready" {
		t.Fatalf("build %s: %+v\n%s", name, info, messages(logs))
	}
	return req
}

func (f *fixture) lastCommit(t *testing.T) string {
	t.Helper()
	_, commits, _ := f.sb.snapshot()
	return commits[len(commits)-1].Name
}

func (f *fixture) tagList(t *testing.T, name string) string {
	t.Helper()
	tags, err := f.svc.Tags(context.Background(), name)
	if err != nil {
		t.Fatalf("tags of %s: %v", name, err)
	}
	var b strings.Builder
	for _, tg := range tags {
		b.WriteString(tg.Tag + "=" + tg.BuildID + " ")
	}
	return strings.TrimSpace(b.String())
}

func (f *fixture) resolves(t *testing.T, ref, want string) {
	t.Helper()
	if got, err := f.svc.ResolveTemplate(context.Background(), ref); err != nil || got != want {
		t.Fatalf("ResolveTemplate(%q) = %q, %v; want %q", ref, got, err, want)
	}
}

func (f *fixture) registered(t *testing.T, name string) bool {
	t.Helper()
	_, err := f.reg.Get(context.Background(), name)
	return err == nil
}

// Tags name builds: a build gets the name's tag and the extra ones;
// tagged builds keep their result in a per-build template while the
// template's own name holds the default; assign, remove, resolve, list,
// the collector and delete follow the tags.
func TestTags(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	notFound := func(err error, has string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), has) {
			t.Fatalf("got %v; want not found with %q", err, has)
		}
	}
	invalid := func(err error, has string) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), has) {
			t.Fatalf("got %v; want invalid argument with %q", err, has)
		}
	}

	// An untagged build commits into the name, as before tags.
	b1 := f.buildNamed(t, "web", nil, "base")
	if f.lastCommit(t) != "web" || f.tagList(t, "web") != "default="+b1.BuildID {
		t.Fatalf("first build: commit %s tags %s", f.lastCommit(t), f.tagList(t, "web"))
	}
	f.resolves(t, "web", "web")
	f.resolves(t, "WEB:default", "web")
	f.resolves(t, "base", "base")
	f.resolves(t, "Not A Name", "Not A Name") // for the node to refuse

	// web:v1 with the extra tag prod: a per-build template.
	b2 := f.buildNamed(t, "web:v1", []string{"prod"}, "base")
	if b2.Tags[0] != "v1" || b2.Tags[1] != "prod" {
		t.Fatalf("requested tags %v", b2.Tags)
	}
	v1 := BuildTemplate(b2.BuildID)
	if f.lastCommit(t) != v1 || !IsBuildTemplate(v1) {
		t.Fatalf("tagged build committed %s, want %s", f.lastCommit(t), v1)
	}
	if got := f.tagList(t, "web"); got != "default="+b1.BuildID+" prod="+b2.BuildID+" v1="+b2.BuildID {
		t.Fatalf("tags %s", got)
	}
	f.resolves(t, "web:v1", v1)
	f.resolves(t, "web:prod", v1)
	f.resolves(t, "web", "web")
	_, err := f.svc.ResolveTemplate(ctx, "web:nope")
	notFound(err, `template "web" has no tag "nope" (its tags: default, prod, v1)`)
	_, err = f.svc.ResolveTemplate(ctx, "nope:v1")
	notFound(err, `template "nope" not found`)
	if ti, err := f.svc.Resolve(ctx, "web:v1"); err != nil || ti.Name != "web" {
		t.Fatalf("alias web:v1: %+v %v", ti, err)
	}
	_, err = f.svc.Resolve(ctx, "web:nope")
	notFound(err, "no tag")

	// Assign: tags of the build a name:tag names; move when they exist.
	got, err := f.svc.AssignTags(ctx, "web:v1", []string{"Stable", "stable"})
	if err != nil || got.BuildID != b2.BuildID || strings.Join(got.Tags, ",") != "stable" {
		t.Fatalf("assign: %+v %v", got, err)
	}
	f.resolves(t, "web:stable", v1)
	_, err = f.svc.AssignTags(ctx, "web:nope", []string{"x"})
	notFound(err, "no tag")
	_, err = f.svc.AssignTags(ctx, "nope", []string{"x"})
	notFound(err, "not found")
	_, err = f.svc.AssignTags(ctx, "web", nil)
	invalid(err, "at least one tag")
	_, err = f.svc.AssignTags(ctx, "web", []string{"0f8fad5b-d9cb-469f-a165-70867728950e"})
	invalid(err, "UUID")

	// An untagged rebuild: only the default pointed at web, so the
	// build replaces it; a tagged one while a sandbox uses web is fine,
	// an untagged one is refused as before.
	b3 := f.buildNamed(t, "web", nil, "base")
	if f.lastCommit(t) != "web" {
		t.Fatalf("untagged rebuild committed %s", f.lastCommit(t))
	}
	now := time.Now()
	sbx := func(id, tpl string) {
		t.Helper()
		if err := f.st.CreateSandbox(ctx, store.Sandbox{ID: id, TemplateID: tpl, StartedAt: now, EndAt: now.Add(time.Hour),
			State: store.StateRunning, EnvdVersion: "0.2.0", EnvdAccessToken: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	sbx("sbx-web", "web")
	req, _ := f.svc.RequestBuild(ctx, BuildRequest{Name: "web"})
	if err := f.svc.StartBuild(ctx, "web", req.BuildID, BuildSpec{FromTemplate: "base", Steps: []Step{}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("untagged rebuild while in use: %v", err)
	}
	b4 := f.buildNamed(t, "web:v2", nil, "base")
	f.resolves(t, "web:v2", BuildTemplate(b4.BuildID))
	if err := f.st.DeleteSandbox(ctx, "sbx-web"); err != nil {
		t.Fatal(err)
	}
	abandon := func(id string) { // a requested build nobody starts
		t.Helper()
		if _, err := f.st.FinishTemplateBuild(ctx, id, store.BuildError, ""); err != nil {
			t.Fatal(err)
		}
	}
	abandon(req.BuildID)

	// stable now points at web (b3): an untagged build must not replace
	// it, so it commits apart and the default moves there.
	if _, err := f.svc.AssignTags(ctx, "web", []string{"stable"}); err != nil {
		t.Fatal(err)
	}
	b5 := f.buildNamed(t, "web", nil, "base")
	b5tpl := BuildTemplate(b5.BuildID)
	if f.lastCommit(t) != b5tpl {
		t.Fatalf("rebuild with another tag on web committed %s", f.lastCommit(t))
	}
	f.resolves(t, "web", b5tpl)
	f.resolves(t, "web:stable", "web")
	if f.tagList(t, "web") != "default="+b5.BuildID+" prod="+b2.BuildID+" stable="+b3.BuildID+" v1="+b2.BuildID+" v2="+b4.BuildID {
		t.Fatalf("tags %s", f.tagList(t, "web"))
	}
	// Building from a tag starts from its template.
	f.buildNamed(t, "child", nil, "web:v1")
	if created, _, _ := f.sb.snapshot(); created[len(created)-1] != v1 {
		t.Fatalf("child built from %s, want %s", created[len(created)-1], v1)
	}
	req, _ = f.svc.RequestBuild(ctx, BuildRequest{Name: "child2"})
	invalid(f.svc.StartBuild(ctx, "child2", req.BuildID, BuildSpec{FromTemplate: "web:nope", Steps: []Step{}}), `no tag "nope"`)
	abandon(req.BuildID)

	// Remove: all or nothing; the default stays; an untagged per-build
	// template goes at once.
	invalid(f.svc.RemoveTags(ctx, "web", []string{"default"}), "cannot be removed")
	invalid(f.svc.RemoveTags(ctx, "web:v1", []string{"prod"}), "should not contain a tag")
	invalid(f.svc.RemoveTags(ctx, "web", nil), "at least one tag")
	notFound(f.svc.RemoveTags(ctx, "web", []string{"prod", "nope"}), "nope")
	notFound(f.svc.RemoveTags(ctx, "nope", []string{"prod"}), "nope")
	if err := f.svc.RemoveTags(ctx, "web", []string{"prod"}); err != nil {
		t.Fatal(err)
	}
	if !f.registered(t, v1) {
		t.Fatal("v1's template went while web:v1 and web:stable... still point at it")
	}
	if err := f.svc.RemoveTags(ctx, "web", []string{"v1"}); err != nil {
		t.Fatal(err)
	}
	if f.registered(t, v1) {
		t.Fatalf("%s stayed with no tag pointing at it", v1)
	}
	f.resolves(t, "web", b5tpl)

	// Moving the default off a per-build template in use keeps it until
	// the collector finds it unused.
	sbx("sbx-b5", b5tpl)
	if _, err := f.svc.AssignTags(ctx, "web:stable", []string{"default"}); err != nil {
		t.Fatal(err)
	}
	f.resolves(t, "web", "web")
	if !f.registered(t, b5tpl) {
		t.Fatal("a per-build template in use went")
	}
	if c, err := f.svc.CollectLeftovers(ctx, 0); err != nil || strings.Contains(strings.Join(c.Templates, ","), b5tpl) {
		t.Fatalf("collect while in use: %+v %v", c, err)
	}
	if err := f.st.DeleteSandbox(ctx, "sbx-b5"); err != nil {
		t.Fatal(err)
	}
	if c, err := f.svc.CollectLeftovers(ctx, 0); err != nil || !strings.Contains(strings.Join(c.Templates, ","), b5tpl) || f.registered(t, b5tpl) {
		t.Fatalf("collect: %+v %v", c, err)
	}
	if !f.registered(t, BuildTemplate(b4.BuildID)) {
		t.Fatal("the collector took a tagged per-build template")
	}

	// A template with tags only (no default) is listed and exists by
	// name, but has no default to create from.
	solo := f.buildNamed(t, "solo:v1", nil, "base")
	list, err := f.svc.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list {
		ids = append(ids, s.TemplateID)
	}
	if strings.Join(ids, ",") != "base,child,solo,web" {
		t.Fatalf("list %v", ids)
	}
	if list[2].BuildID != solo.BuildID || list[2].BuildStatus != "ready" {
		t.Fatalf("solo listed as %+v", list[2])
	}
	if ti, err := f.svc.Resolve(ctx, "solo"); err != nil || ti.Name != "solo" {
		t.Fatalf("alias solo: %+v %v", ti, err)
	}
	_, err = f.svc.Resolve(ctx, "solo:default")
	notFound(err, "no tag")
	_, err = f.svc.ResolveTemplate(ctx, "solo")
	notFound(err, `template "solo" has no tag "default" (its tags: v1)`)

	// Delete: whole templates only; refused while any of its templates is
	// in use; then every template of it goes with its tags and builds.
	invalid(f.svc.Delete(ctx, "web:v2"), "removeTags")
	sbx("sbx-v2", BuildTemplate(b4.BuildID))
	if err := f.svc.Delete(ctx, "web"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sbx-v2") {
		t.Fatalf("delete while a tag's template is in use: %v", err)
	}
	if err := f.st.DeleteSandbox(ctx, "sbx-v2"); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Delete(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", BuildTemplate(b4.BuildID), v1, b5tpl} {
		if f.registered(t, name) {
			t.Errorf("%s stayed after the delete", name)
		}
	}
	_, err = f.svc.Tags(ctx, "web")
	notFound(err, "web")
	if builds, _ := f.st.ListTemplateBuilds(ctx, "web"); len(builds) != 0 {
		t.Fatalf("builds of web stayed: %d", len(builds))
	}
	notFound(f.svc.Delete(ctx, "web"), "web")
	if err := f.svc.Delete(ctx, "solo"); err != nil || f.registered(t, BuildTemplate(solo.BuildID)) {
		t.Fatalf("delete solo: %v", err)
	}
	_, err = f.svc.AssignTags(ctx, "solo:v1", []string{"x"})
	notFound(err, "solo")
}

// Whatever the input, an accepted name:tag has a valid name and tag that
// parse back to themselves, and a build's tags are valid, distinct and
// never empty.
func FuzzParseRef(f *testing.F) {
	for _, seed := range []string{"web", " Web:V1 ", "web:default", "web:", ":v1", "a:b:c", "team/web:v1", "web:0f8fad5b-d9cb-469f-a165-70867728950e",
		"web:" + strings.Repeat("x", 129), BuildTemplate("0f8fad5b-d9cb-469f-a165-70867728950e")} {
		f.Add(seed, "prod,stable")
	}
	f.Fuzz(func(t *testing.T, ref, extra string) {
		name, tag, err := ParseRef(ref)
		if err == nil {
			if template.ValidateName(name) != nil || !tagRE.MatchString(tag) || uuidRE.MatchString(tag) || len(tag) > maxTagLen {
				t.Fatalf("ParseRef(%q) = %q, %q", ref, name, tag)
			}
			if n2, t2, err := ParseRef(name + ":" + tag); err != nil || n2 != name || t2 != tag {
				t.Fatalf("%q:%q does not parse back: %q %q %v", name, tag, n2, t2, err)
			}
		}
		n, tags, err := ParseBuildName(ref, strings.Split(extra, ","))
		if err != nil {
			return
		}
		if n != name || len(tags) == 0 || IsBuildTemplate(n) {
			t.Fatalf("ParseBuildName(%q, %q) = %q, %q", ref, extra, n, tags)
		}
		seen := map[string]bool{}
		for _, tg := range tags {
			if seen[tg] || !tagRE.MatchString(tg) {
				t.Fatalf("ParseBuildName(%q, %q) tags %q", ref, extra, tags)
			}
			seen[tg] = true
		}
	})
}
