package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/errdefs"
)

func TestRecords(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadInfo(dir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing: %v", err)
	}
	in := Info{Schema: SchemaVersion, PID: 12, InitPID: 13, Version: "v1", Socket: "/s", StartedAt: time.Unix(5, 0).UTC()}
	if err := atomicfile.WriteJSON(filepath.Join(dir, InfoFile), in, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := ReadInfo(dir); err != nil || out != in {
		t.Errorf("round trip: %+v, %v", out, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("temp files left: %v", ents)
	}
	os.WriteFile(filepath.Join(dir, InfoFile), []byte(`{"schema": 99}`), 0o644)
	if _, err := ReadInfo(dir); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("newer schema: %v, want ErrFailedPrecondition", err)
	}
	os.WriteFile(filepath.Join(dir, ExitFile), []byte(`{`), 0o644)
	if _, err := ReadExit(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("corrupt: %v, want ErrInvalidArgument", err)
	}
}

func FuzzReadInfo(f *testing.F) {
	f.Add([]byte(`{"schema":1,"pid":3,"initPid":4,"version":"dev","socket":"/x","startedAt":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"schema":2}`))
	f.Add([]byte(`[]`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, InfoFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		i, err := ReadInfo(dir)
		if err == nil && i.Schema > SchemaVersion {
			t.Fatalf("accepted schema %d", i.Schema)
		}
	})
}
