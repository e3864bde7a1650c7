package template

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A result cache misses until saved; then a registry of another data dir
// registers the template from it with the same files and metadata; an
// unusable cache is a miss and is removed.
func TestResultCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: registration keeps owners")
	}
	ctx := context.Background()
	cache := t.TempDir()
	a := &Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: cache}
	if _, ok, err := a.ResultCache("thing-1").Register(ctx, "thing", io.Discard); ok || err != nil {
		t.Fatalf("empty cache: %v %v", ok, err)
	}
	src, err := a.Register(ctx, "thing", Meta{MemoryMB: 1024, Source: "recipe", Defaults: &Defaults{User: "user", Workdir: "/home/user"}},
		func(ctx context.Context, rootfs string) error {
			return os.WriteFile(filepath.Join(rootfs, "hello"), []byte("hi"), 0o644)
		})
	if err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(cache, "thing-1.tar.tmp-0123") // of a Save that was killed
	if err := os.WriteFile(leftover, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.ResultCache("thing-1").Save(ctx, src); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("a killed Save's temporary file is kept: %v", err)
	}
	b := &Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: cache}
	got, ok, err := b.ResultCache("thing-1").Register(ctx, "thing", io.Discard)
	if err != nil || !ok {
		t.Fatalf("cached register: %v %v", ok, err)
	}
	if data, err := os.ReadFile(filepath.Join(got.RootfsPath, "hello")); err != nil || string(data) != "hi" {
		t.Errorf("file: %q %v", data, err)
	}
	if got.MemoryMB != 1024 || got.Defaults == nil || got.Defaults.User != "user" || got.Source != "recipe (cached)" {
		t.Errorf("metadata %+v %+v", got, got.Defaults)
	}
	if _, ok, _ := b.ResultCache("thing-2").Register(ctx, "other", io.Discard); ok {
		t.Error("another key hit")
	}
	// Metadata without its tar: a miss, and the metadata is removed.
	if err := os.Remove(filepath.Join(cache, "thing-1.tar")); err != nil {
		t.Fatal(err)
	}
	c := &Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: cache}
	if _, ok, err := c.ResultCache("thing-1").Register(ctx, "thing", io.Discard); ok || err != nil {
		t.Fatalf("broken cache: %v %v", ok, err)
	}
	if _, err := os.Stat(filepath.Join(cache, "thing-1.tar.json")); !os.IsNotExist(err) {
		t.Errorf("metadata kept: %v", err)
	}
	if _, err := c.Get(ctx, "thing"); err == nil {
		t.Error("a broken cache registered the template")
	}
}
