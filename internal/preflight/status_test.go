package preflight

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

func failedReport() Report {
	return Report{Runtime: "ns", Results: []Result{
		{Name: "kernel.overlayfs", Status: StatusOK},
		{Name: "network.port-range", Status: StatusFail, Message: "port 20001 is in use"},
		{Name: "node.cni", Status: StatusWarn, Message: "calico"},
	}}
}

func writePassed(t *testing.T, dir string, gen int, at time.Time) {
	t.Helper()
	fp, err := NewFingerprint(gen, "n1", "v0.1.0", "6.18", passedReport(), at)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFingerprint(dir, fp); err != nil {
		t.Fatal(err)
	}
}

func writeFailed(t *testing.T, dir string, gen int, at time.Time) {
	t.Helper()
	if err := WriteFailure(dir, NewFailure(gen, "n1", "v0.1.0", failedReport(), at)); err != nil {
		t.Fatal(err)
	}
}

func TestLatestPrepNone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "prep")
	if st := LatestPrep(dir); st.State != PrepNone || !strings.Contains(st.Detail, dir) {
		t.Fatalf("missing dir: %+v", st)
	}
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, ".prep-123"), []byte("{"), 0o644)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "0.fingerprint"), []byte("{}"), 0o644)
	if st := LatestPrep(dir); st.State != PrepNone {
		t.Fatalf("dir without records: %+v", st)
	}
}

func TestLatestPrepPassedThenFailed(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	writePassed(t, dir, 1, t0)
	st := LatestPrep(dir)
	if st.State != PrepPassed || st.Generation != 1 || !st.At.Equal(t0) || st.Warnings != 0 || len(st.Failed) != 0 {
		t.Fatalf("after gen 1 passed: %+v", st)
	}
	// Generation 2 fails: the newest record wins over the older pass.
	writeFailed(t, dir, 2, t0.Add(time.Minute))
	st = LatestPrep(dir)
	if st.State != PrepFailed || st.Generation != 2 || len(st.Failed) != 1 || st.Failed[0] != "network.port-range: port 20001 is in use" {
		t.Fatalf("after gen 2 failed: %+v", st)
	}
	// Then it passes: cube prep clears the failure.
	writePassed(t, dir, 2, t0.Add(2*time.Minute))
	if err := ClearFailure(dir, 2); err != nil {
		t.Fatal(err)
	}
	if err := ClearFailure(dir, 2); err != nil {
		t.Fatalf("clearing twice: %v", err)
	}
	if st = LatestPrep(dir); st.State != PrepPassed || st.Generation != 2 {
		t.Fatalf("after gen 2 passed: %+v", st)
	}
	// A re-run of generation 2 that fails later than its pass counts.
	writeFailed(t, dir, 2, t0.Add(3*time.Minute))
	if st = LatestPrep(dir); st.State != PrepFailed || st.Generation != 2 {
		t.Fatalf("after gen 2 re-run failed: %+v", st)
	}
}

func TestLatestPrepRollbackReportsNewestRun(t *testing.T) {
	dir := t.TempDir()
	now := time.Now().UTC()
	writePassed(t, dir, 3, now.Add(-time.Hour))
	writePassed(t, dir, 2, now)
	if st := LatestPrep(dir); st.State != PrepPassed || st.Generation != 2 {
		t.Fatalf("generation lowered to 2 and re-run: %+v", st)
	}
}

func TestLatestPrepInvalid(t *testing.T) {
	dir := t.TempDir()
	writePassed(t, dir, 1, time.Now().Add(-time.Hour))
	if err := os.WriteFile(filepath.Join(dir, "2.failed"), []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := LatestPrep(dir)
	if st.State != PrepInvalid || st.Generation != 2 || !strings.Contains(st.Detail, "2.failed") {
		t.Fatalf("corrupt newest record: %+v", st)
	}
	// A fingerprint whose content names another generation is invalid too.
	fp, _ := NewFingerprint(5, "n1", "v", "k", passedReport(), time.Now())
	WriteFingerprint(dir, fp)
	os.Rename(FingerprintPath(dir, 5), FingerprintPath(dir, 6))
	if st := LatestPrep(dir); st.State != PrepInvalid || st.Generation != 6 {
		t.Fatalf("fingerprint with another generation: %+v", st)
	}
}

func TestWriteFailureRefusesGenerationZero(t *testing.T) {
	if err := WriteFailure(t.TempDir(), Failure{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("generation 0: %v", err)
	}
}
