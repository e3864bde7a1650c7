package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// A build goes waiting -> building -> ready exactly once; later writers
// cannot overwrite the outcome, and the unfinished list follows.
func TestTemplateBuildLifecycle(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		if err := s.CreateTemplateBuild(ctx, TemplateBuild{ID: "b1", Template: "web", Status: BuildWaiting, CPUCount: 2, MemoryMB: 1024}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateTemplateBuild(ctx, TemplateBuild{ID: "b1", Template: "web", Status: BuildWaiting}); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("duplicate id: %v", err)
		}
		if err := s.CreateTemplateBuild(ctx, TemplateBuild{ID: "b2", Template: "other", Status: BuildWaiting}); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTemplateBuild(ctx, "b1")
		if err != nil || got.Template != "web" || got.Status != BuildWaiting || got.CPUCount != 2 || got.MemoryMB != 1024 ||
			got.FinishedAt != nil || got.CreatedAt.IsZero() {
			t.Fatalf("fresh build %+v, %v", got, err)
		}
		if _, err := s.GetTemplateBuild(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("unknown build: %v", err)
		}
		if err := s.StartTemplateBuild(ctx, "b1", "replica-a"); err != nil {
			t.Fatal(err)
		}
		if err := s.StartTemplateBuild(ctx, "b1", "replica-a"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("second start: %v", err)
		}
		if err := s.StartTemplateBuild(ctx, "nope", "replica-a"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("start of an unknown build: %v", err)
		}
		if err := s.SetTemplateBuildSandbox(ctx, "b1", "sbx-1"); err != nil {
			t.Fatal(err)
		}
		unfinished, err := s.UnfinishedTemplateBuilds(ctx)
		if err != nil || len(unfinished) != 2 || unfinished[0].ID != "b1" || unfinished[0].SandboxID != "sbx-1" || unfinished[0].Status != BuildBuilding {
			t.Fatalf("unfinished %+v, %v", unfinished, err)
		}
		if _, err := s.FinishTemplateBuild(ctx, "b1", BuildBuilding, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("finish with a non-terminal status: %v", err)
		}
		if ok, err := s.FinishTemplateBuild(ctx, "b1", BuildReady, ""); !ok || err != nil {
			t.Fatalf("finish: %v %v", ok, err)
		}
		if ok, err := s.FinishTemplateBuild(ctx, "b1", BuildError, `{"message":"late"}`); ok || err != nil {
			t.Fatalf("second finish: %v %v", ok, err)
		}
		if _, err := s.FinishTemplateBuild(ctx, "nope", BuildError, ""); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("finish of an unknown build: %v", err)
		}
		got, err = s.GetTemplateBuild(ctx, "b1")
		if err != nil || got.Status != BuildReady || got.Reason != "" || got.FinishedAt == nil {
			t.Fatalf("finished build %+v, %v", got, err)
		}
		if ok, err := s.FinishTemplateBuild(ctx, "b2", BuildError, `{"message":"interrupted"}`); !ok || err != nil {
			t.Fatalf("finish b2 from waiting: %v %v", ok, err)
		}
		if got, _ := s.GetTemplateBuild(ctx, "b2"); got.Status != BuildError || got.Reason != `{"message":"interrupted"}` {
			t.Fatalf("errored build %+v", got)
		}
		if unfinished, err := s.UnfinishedTemplateBuilds(ctx); err != nil || len(unfinished) != 0 {
			t.Fatalf("unfinished after finishing: %+v, %v", unfinished, err)
		}
		all, err := s.ListTemplateBuilds(ctx, "")
		web, err2 := s.ListTemplateBuilds(ctx, "web")
		none, err3 := s.ListTemplateBuilds(ctx, "none")
		if err != nil || err2 != nil || err3 != nil || len(all) != 2 || len(web) != 1 || web[0].ID != "b1" || none == nil || len(none) != 0 {
			t.Fatalf("lists: %+v %+v %+v; %v %v %v", all, web, none, err, err2, err3)
		}
	})
}

// Logs page by seq; deleting a template's builds removes their logs.
func TestTemplateBuildLogs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		for _, id := range []string{"b1", "b2"} {
			if err := s.CreateTemplateBuild(ctx, TemplateBuild{ID: id, Template: "web", Status: BuildWaiting}); err != nil {
				t.Fatal(err)
			}
		}
		ts := time.Date(2026, 12, 1, 21, 15, 43, 444_000_000, time.UTC)
		var batch []BuildLogEntry
		for i := range 7 {
			batch = append(batch, BuildLogEntry{Time: ts.Add(time.Duration(i) * time.Millisecond), Level: "info", Step: fmt.Sprint(i), Message: fmt.Sprint("line ", i)})
		}
		if err := s.AppendTemplateBuildLogs(ctx, "b1", 0, batch[:4]); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendTemplateBuildLogs(ctx, "b1", 4, batch[4:]); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendTemplateBuildLogs(ctx, "b1", 4, batch[4:5]); err == nil {
			t.Fatal("appending an existing seq succeeded")
		}
		if err := s.AppendTemplateBuildLogs(ctx, "b2", 0, batch[:1]); err != nil {
			t.Fatal(err)
		}
		page, err := s.TemplateBuildLogs(ctx, "b1", 2, 3)
		if err != nil || len(page) != 3 || page[0].Seq != 2 || page[0].Message != "line 2" || page[2].Seq != 4 ||
			!page[0].Time.Equal(ts.Add(2*time.Millisecond)) || page[0].Level != "info" || page[0].Step != "2" {
			t.Fatalf("page %+v, %v", page, err)
		}
		if tail, err := s.TemplateBuildLogs(ctx, "b1", 7, 100); err != nil || tail == nil || len(tail) != 0 {
			t.Fatalf("past the end: %+v, %v", tail, err)
		}
		if n, err := s.TemplateBuildLogCount(ctx, "b1"); n != 7 || err != nil {
			t.Fatalf("count %d, %v", n, err)
		}
		if err := s.DeleteTemplateBuilds(ctx, "web"); err != nil {
			t.Fatal(err)
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM template_build_logs`); n != 0 {
			t.Fatalf("%d log rows left after delete", n)
		}
		if _, err := s.GetTemplateBuild(ctx, "b1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("build after delete: %v", err)
		}
	})
}
