package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Tags point template:tag at a build and its registry template; putting
// reports what it replaced, removing is all or nothing, deleting a
// template's tags takes its builds' recorded tags along.
func TestTemplateTags(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()

		// A build's requested tags, in order, replaced as a whole.
		if got, err := s.TemplateBuildTags(ctx, "b1"); err != nil || got == nil || len(got) != 0 {
			t.Fatalf("tags of a build without any: %#v, %v", got, err)
		}
		if err := s.SetTemplateBuildTags(ctx, "b1", []string{"v1", "prod", "v1"}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.TemplateBuildTags(ctx, "b1"); err != nil || strings.Join(got, ",") != "v1,prod" {
			t.Fatalf("build tags %v, %v", got, err)
		}
		if err := s.SetTemplateBuildTags(ctx, "b1", []string{"stable", "default"}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.TemplateBuildTags(ctx, "b1"); strings.Join(got, ",") != "stable,default" {
			t.Fatalf("replaced build tags %v", got)
		}

		if _, err := s.GetTemplateTag(ctx, "web", "v1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("unknown tag: %v", err)
		}
		if _, err := s.PutTemplateTags(ctx, "web", nil, "b1", "web"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("no tags: %v", err)
		}
		replaced, err := s.PutTemplateTags(ctx, "web", []string{"default", "v1"}, "b1", "web")
		if err != nil || len(replaced) != 0 {
			t.Fatalf("first put: %v, %v", replaced, err)
		}
		got, err := s.GetTemplateTag(ctx, "web", "v1")
		if err != nil || got.BuildID != "b1" || got.Target != "web" || got.CreatedAt.IsZero() {
			t.Fatalf("web:v1 = %+v, %v", got, err)
		}
		// Moving v1 (and adding prod) to another build reports the old v1.
		replaced, err = s.PutTemplateTags(ctx, "web", []string{"v1", "prod"}, "b2", "build-b2")
		if err != nil || len(replaced) != 1 || replaced[0].Tag != "v1" || replaced[0].Target != "web" {
			t.Fatalf("second put: %+v, %v", replaced, err)
		}
		if _, err := s.PutTemplateTags(ctx, "other", []string{"default"}, "", "other"); err != nil {
			t.Fatal(err)
		}
		all, err := s.ListTemplateTags(ctx, "")
		if err != nil || len(all) != 4 || all[0].Template != "other" || all[1].Tag != "default" || all[2].Tag != "prod" || all[3].Tag != "v1" {
			t.Fatalf("all tags %+v, %v", all, err)
		}
		web, err := s.ListTemplateTags(ctx, "web")
		if err != nil || len(web) != 3 {
			t.Fatalf("tags of web %+v, %v", web, err)
		}
		of, err := s.TemplateTagsOf(ctx, "build-b2")
		if err != nil || len(of) != 2 || of[0].Tag != "prod" || of[1].Tag != "v1" {
			t.Fatalf("tags of build-b2 %+v, %v", of, err)
		}
		if none, err := s.TemplateTagsOf(ctx, "nothing"); err != nil || none == nil || len(none) != 0 {
			t.Fatalf("tags of an untargeted template %#v, %v", none, err)
		}

		// Removing is all or nothing.
		if _, err := s.RemoveTemplateTags(ctx, "web", []string{"prod", "nope"}); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("remove with an unknown tag: %v", err)
		}
		if _, err := s.GetTemplateTag(ctx, "web", "prod"); err != nil {
			t.Fatalf("prod went with a failed remove: %v", err)
		}
		removed, err := s.RemoveTemplateTags(ctx, "web", []string{"prod"})
		if err != nil || len(removed) != 1 || removed[0].Target != "build-b2" {
			t.Fatalf("remove: %+v, %v", removed, err)
		}

		// Deleting a template's tags takes its builds' tags along.
		if err := s.CreateTemplateBuild(ctx, TemplateBuild{ID: "b1", Template: "web", Status: BuildWaiting}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetTemplateBuildTags(ctx, "ob", []string{"x"}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteTemplateTags(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		if web, _ := s.ListTemplateTags(ctx, "web"); len(web) != 0 {
			t.Fatalf("tags of web after delete: %+v", web)
		}
		if got, _ := s.TemplateBuildTags(ctx, "b1"); len(got) != 0 {
			t.Fatalf("build tags after delete: %v", got)
		}
		if got, _ := s.TemplateBuildTags(ctx, "ob"); len(got) != 1 {
			t.Fatalf("another build's tags went too: %v", got)
		}
		if _, err := s.GetTemplateTag(ctx, "other", "default"); err != nil {
			t.Fatalf("another template's tag went too: %v", err)
		}
	})
}
