package preflight

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

func passedReport() Report {
	return Check(goodConfig(), goodFacts())
}

func TestFingerprintRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "prep")
	if _, err := NewFingerprint(3, "n1", "v0.1.0", "6.18", Report{}, time.Now()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fingerprint of a failed report: %v", err)
	}
	fp, err := NewFingerprint(3, "n1", "v0.1.0", "6.18", passedReport(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteFingerprint(dir, fp); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFingerprint(dir, 3)
	if err != nil || got.Generation != 3 || got.Node != "n1" || got.ReportDigest != fp.ReportDigest || got.Runtime != "ns" {
		t.Fatalf("read = %+v, %v", got, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "3.fingerprint" {
		t.Fatalf("dir holds %v, want only 3.fingerprint (no temp files)", ents)
	}
	if _, err := ReadFingerprint(dir, 4); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing generation: %v", err)
	}
	// A file renamed to another generation's name is refused.
	os.Rename(FingerprintPath(dir, 3), FingerprintPath(dir, 5))
	if _, err := ReadFingerprint(dir, 5); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("mismatching generation: %v", err)
	}
	os.WriteFile(FingerprintPath(dir, 6), []byte(`{"schema":99,"generation":6}`), 0o644)
	if _, err := ReadFingerprint(dir, 6); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("newer schema: %v", err)
	}
	os.WriteFile(FingerprintPath(dir, 7), []byte(`{trunc`), 0o644)
	if _, err := ReadFingerprint(dir, 7); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("corrupt: %v", err)
	}
	if err := WriteFingerprint(dir, Fingerprint{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("generation 0: %v", err)
	}
}

func TestReadGeneration(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "generation")
	os.WriteFile(p, []byte("12\n"), 0o644)
	if n, err := ReadGeneration(p); err != nil || n != 12 {
		t.Fatalf("= %d, %v", n, err)
	}
	for _, bad := range []string{"", "0", "-1", "x"} {
		os.WriteFile(p, []byte(bad), 0o644)
		if _, err := ReadGeneration(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := ReadGeneration(filepath.Join(dir, "absent")); err == nil {
		t.Fatal("absent file accepted")
	}
}

func TestWaitFingerprint(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := WaitFingerprint(ctx, dir, 1, 10*time.Millisecond); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("timeout: %v", err)
	}
	fp, _ := NewFingerprint(2, "n1", "v", "k", passedReport(), time.Now())
	go func() {
		time.Sleep(50 * time.Millisecond)
		WriteFingerprint(dir, fp)
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	got, err := WaitFingerprint(ctx2, dir, 2, 10*time.Millisecond)
	if err != nil || got.Generation != 2 {
		t.Fatalf("wait = %+v, %v", got, err)
	}
}
