package preflight

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestInstallArtifacts(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "artifacts")
	os.WriteFile(filepath.Join(src, "envd"), []byte("envd v1"), 0o755)
	os.MkdirAll(filepath.Join(src, "vm"), 0o755)
	os.WriteFile(filepath.Join(src, "vm", "kernel"), []byte("kernel"), 0o644)

	arts, changed, err := InstallArtifacts(src, dst)
	if err != nil || len(arts) != 2 || changed != 2 {
		t.Fatalf("first install = %+v, %d, %v", arts, changed, err)
	}
	st, _ := os.Stat(filepath.Join(dst, "envd"))
	if st.Mode().Perm() != 0o755 {
		t.Fatalf("envd mode = %v", st.Mode())
	}
	// A reader holding the old envd (like a sandbox's bind mount) keeps it
	// across an upgrade; a new reader sees the new file; nothing else is
	// rewritten.
	old, err := os.Open(filepath.Join(dst, "envd"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	kst, _ := os.Stat(filepath.Join(dst, "vm", "kernel"))
	os.WriteFile(filepath.Join(src, "envd"), []byte("envd v2"), 0o755)
	if _, changed, err = InstallArtifacts(src, dst); err != nil || changed != 1 {
		t.Fatalf("upgrade: changed=%d err=%v", changed, err)
	}
	buf := make([]byte, 16)
	n, _ := old.ReadAt(buf, 0)
	if string(buf[:n]) != "envd v1" {
		t.Fatalf("old reader sees %q", buf[:n])
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "envd")); string(b) != "envd v2" {
		t.Fatalf("new envd = %q", b)
	}
	kst2, _ := os.Stat(filepath.Join(dst, "vm", "kernel"))
	if kst.Sys().(*syscall.Stat_t).Ino != kst2.Sys().(*syscall.Stat_t).Ino {
		t.Fatal("unchanged kernel was rewritten")
	}
	if _, err := os.Stat(filepath.Join(dst, ManifestName)); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dst)
	for _, e := range ents {
		if filepath.Ext(e.Name()) != "" && e.Name() != ManifestName {
			t.Errorf("leftover %s", e.Name())
		}
	}

	if _, _, err := InstallArtifacts(filepath.Join(src, "absent"), dst); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("absent source: %v", err)
	}
	if _, _, err := InstallArtifacts(t.TempDir(), dst); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("empty source: %v", err)
	}
}
