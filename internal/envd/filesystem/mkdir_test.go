package filesystem

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cube-dev/cube/internal/envd/account"
	"github.com/cube-dev/cube/internal/errdefs"
)

func TestMkdirAllAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	root := t.TempDir()
	target := filepath.Join(root, "a", "b")
	if err := MkdirAllAs(target, 1234, 4321); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a", "a/b"} {
		fi, err := os.Stat(filepath.Join(root, d))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 4321 {
			t.Errorf("%s owned by %d:%d", d, st.Uid, st.Gid)
		}
	}
	// Existing directories are left alone (root still owns the temp dir).
	fi, _ := os.Stat(root)
	if fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("existing parent was chowned")
	}
	if err := MkdirAllAs(target, 1, 1); err != nil {
		t.Fatalf("existing: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MkdirAllAs(filepath.Join(root, "f"), 0, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("file in the way: %v", err)
	}
	if err := MkdirAllAs(filepath.Join(root, "f", "x"), 0, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("below a file: %v", err)
	}
}

func TestWatcherCloseStopsLoop(t *testing.T) {
	dir := t.TempDir()
	s := New(account.NewSettings("", ""))
	w, err := newWatcher(watchSpec{root: dir, recursive: true}, s.names())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	if err := w.close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, ok := <-w.events; ok {
		t.Fatal("events channel still open")
	}
	if _, err := newWatcher(watchSpec{root: filepath.Join(dir, "missing")}, s.names()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing root: %v", err)
	}
}
