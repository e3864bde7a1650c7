package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// A template file larger than a chunk round-trips; concurrent writers of
// one hash all succeed and exactly one write is kept (first writer wins);
// a used file survives the collection of unused ones; chunks of a write
// that never completed are removed once old.
func TestTemplateFiles(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		hash := strings.Repeat("a", 64)
		data := make([]byte, 2*TemplateFileChunkSize+123)
		rand.Read(data)
		if ok, err := s.TouchTemplateFile(ctx, hash); ok || err != nil {
			t.Fatalf("touch of a missing file: %v %v", ok, err)
		}
		if _, err := s.OpenTemplateFile(ctx, hash); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("open of a missing file: %v", err)
		}
		stored := concurrentPuts(t, 4, func() (bool, error) { return s.PutTemplateFile(ctx, hash, bytes.NewReader(data)) })
		if stored != 1 {
			t.Fatalf("%d writers stored the file; want 1", stored)
		}
		// Later writes of a stored hash change nothing.
		if ok, err := s.PutTemplateFile(ctx, hash, strings.NewReader("other")); ok || err != nil {
			t.Fatalf("second write: %v %v", ok, err)
		}
		r, err := s.OpenTemplateFile(ctx, hash)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back %d bytes (want %d): %v", len(got), len(data), err)
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM template_file_chunks`); n != 3 {
			t.Fatalf("%d chunks stored; want the 3 of one write (losers' removed)", n)
		}
		empty := strings.Repeat("e", 64)
		if ok, err := s.PutTemplateFile(ctx, empty, bytes.NewReader(nil)); !ok || err != nil {
			t.Fatalf("empty file: %v %v", ok, err)
		}
		if r, err := s.OpenTemplateFile(ctx, empty); err != nil {
			t.Fatal(err)
		} else if got, err := io.ReadAll(r); err != nil || len(got) != 0 {
			t.Fatalf("empty file read %q %v", got, err)
		}

		// An interrupted write: chunks without a file row.
		rawExec(t, s, `INSERT INTO template_file_chunks (upload_id, seq, data, created_at) VALUES (?, ?, ?, ?)`,
			"orphan", 0, []byte("x"), toNanos(time.Now().Add(-2*time.Hour)))
		rawExec(t, s, `INSERT INTO template_file_chunks (upload_id, seq, data, created_at) VALUES (?, ?, ?, ?)`,
			"in-progress", 0, []byte("x"), toNanos(time.Now()))
		// Unused for a day: the empty file; the big one is touched now.
		rawExec(t, s, `UPDATE template_files SET used_at = ?`, toNanos(time.Now().Add(-24*time.Hour)))
		if ok, err := s.TouchTemplateFile(ctx, hash); !ok || err != nil {
			t.Fatalf("touch: %v %v", ok, err)
		}
		gone, err := s.DeleteUnusedTemplateFiles(ctx, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour))
		if err != nil || len(gone) != 1 || gone[0] != empty {
			t.Fatalf("collected %v %v", gone, err)
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM template_file_chunks WHERE upload_id = ?`, "orphan"); n != 0 {
			t.Fatal("old orphan chunks kept")
		}
		if n := rawCount(t, s, `SELECT COUNT(*) FROM template_file_chunks WHERE upload_id = ?`, "in-progress"); n != 1 {
			t.Fatal("chunks of a write in progress removed")
		}
		if r, err := s.OpenTemplateFile(ctx, hash); err != nil {
			t.Fatal(err)
		} else if got, _ := io.ReadAll(r); !bytes.Equal(got, data) {
			t.Fatal("used file damaged by the collection")
		}
	})
}

// The first SharedSecret call's candidate is every caller's secret.
func TestSharedSecret(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, dsn := openTest(t, b)
		ctx := context.Background()
		if _, err := s.SharedSecret(ctx, "k", nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("empty candidate: %v", err)
		}
		first, err := s.SharedSecret(ctx, "k", []byte("one"))
		if err != nil || string(first) != "one" {
			t.Fatalf("first %q %v", first, err)
		}
		other := openDSN(t, dsn) // another replica
		if got, err := other.SharedSecret(ctx, "k", []byte("two")); err != nil || string(got) != "one" {
			t.Fatalf("second replica got %q %v", got, err)
		}
		if got, err := other.SharedSecret(ctx, "k2", []byte("two")); err != nil || string(got) != "two" {
			t.Fatalf("other name %q %v", got, err)
		}
	})
}

// The owner's heartbeat keeps a build from being failed as stale; once the
// heartbeat stops, one replica fails it and the owner learns it lost it.
func TestTemplateBuildOwnership(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s, _ := openTest(t, b)
		ctx := context.Background()
		if err := s.CreateTemplateBuild(ctx, TemplateBuild{ID: "b1", Template: "web", Status: BuildWaiting}); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.HeartbeatTemplateBuild(ctx, "b1", "a", time.Now()); ok || err != nil {
			t.Fatalf("heartbeat of a waiting build: %v %v", ok, err)
		}
		if err := s.StartTemplateBuild(ctx, "b1", "a"); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetTemplateBuild(ctx, "b1")
		if err != nil || got.Owner != "a" || got.Status != BuildBuilding {
			t.Fatalf("started %+v %v", got, err)
		}
		if ok, err := s.HeartbeatTemplateBuild(ctx, "b1", "b", time.Now()); ok || err != nil {
			t.Fatalf("heartbeat by a non-owner: %v %v", ok, err)
		}
		if ok, err := s.HeartbeatTemplateBuild(ctx, "b1", "a", time.Now()); !ok || err != nil {
			t.Fatalf("heartbeat: %v %v", ok, err)
		}
		// Fresh: not stale as of a minute ago.
		if ok, err := s.FailStaleTemplateBuild(ctx, "b1", time.Now().Add(-time.Minute), "gone"); ok || err != nil {
			t.Fatalf("fresh build failed: %v %v", ok, err)
		}
		rawExec(t, s, `UPDATE template_builds SET updated_at = ?`, toNanos(time.Now().Add(-time.Hour)))
		if ok, err := s.FailStaleTemplateBuild(ctx, "b1", time.Now().Add(-time.Minute), "gone"); !ok || err != nil {
			t.Fatalf("stale build: %v %v", ok, err)
		}
		if ok, err := s.FailStaleTemplateBuild(ctx, "b1", time.Now(), "again"); ok || err != nil {
			t.Fatalf("second fail: %v %v", ok, err)
		}
		got, _ = s.GetTemplateBuild(ctx, "b1")
		if got.Status != BuildError || got.Reason != "gone" || got.FinishedAt == nil {
			t.Fatalf("failed build %+v", got)
		}
		if ok, err := s.HeartbeatTemplateBuild(ctx, "b1", "a", time.Now()); ok || err != nil {
			t.Fatalf("heartbeat after the build was failed: %v %v", ok, err)
		}
	})
}
