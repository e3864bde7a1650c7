package exepath

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSibling(t *testing.T) {
	dir := t.TempDir()
	main := filepath.Join(dir, "cube")
	for name, mode := range map[string]os.FileMode{"exec": 0o755, "plain": 0o644} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "subdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"exec": true, "plain": false, "subdir": false, "missing": false} {
		p, ok := Sibling(main, name)
		if ok != want || p != filepath.Join(dir, name) {
			t.Errorf("Sibling(%s) = %s, %v; want %v", name, p, ok, want)
		}
	}
}
