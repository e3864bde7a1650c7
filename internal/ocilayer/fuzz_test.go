package ocilayer

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzApply feeds arbitrary bytes as a layer on top of a small lower layer
// holding symlinks out of the root: Apply may fail but must never panic nor
// touch the directory next to the root.
func FuzzApply(f *testing.F) {
	f.Add(tarOf(f, file("a", "a", 0o644), dir("d", 0o755), wh("d/.wh..wh..opq"), wh(".wh.a")))
	f.Add(tarOf(f, file("up/pwned", "x", 0o644), file("abs/pwned", "x", 0o644), hard("h", "abs/victim")))
	f.Add(tarOf(f, sym("x", "/"), file("x/y", "y", 0o4755), file("../z", "z", 0o644)))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		outside, root := filepath.Join(base, "outside"), filepath.Join(base, "root")
		os.Mkdir(outside, 0o755)
		os.Mkdir(root, 0o755)
		os.WriteFile(filepath.Join(outside, "victim"), []byte("safe"), 0o644)
		lower := tarOf(t, sym("up", "../outside"), sym("abs", outside), sym("dot", ".."))
		opts := Options{IgnoreOwners: os.Geteuid() != 0}
		if _, err := Apply(context.Background(), root, bytes.NewReader(lower), opts); err != nil {
			t.Fatal(err)
		}
		_, _ = Apply(context.Background(), root, bytes.NewReader(data), opts)
		entries, _ := os.ReadDir(outside)
		b, _ := os.ReadFile(filepath.Join(outside, "victim"))
		if len(entries) != 1 || string(b) != "safe" {
			t.Fatalf("outside changed: %v %q", entries, b)
		}
		if entries, _ := os.ReadDir(base); len(entries) != 2 {
			t.Fatalf("base changed: %v", entries)
		}
	})
}
