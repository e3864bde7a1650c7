package rootfstest

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cube-dev/cube/internal/template"
)

// Base registers a realistically sized flat template called "base" in reg
// (for benchmarks of what templates cost) and returns it with a line that
// says what it is: Cube's real base template when the debootstrap result it
// is built from is cached in template.DefaultCacheDir() (`cube up` or
// TestEnsureBase leave it there; extracting it takes seconds), else a
// generated tree of 150 MiB in 6000 files (Generate). It never runs
// debootstrap. It skips tb without root: templates keep owners.
func Base(tb testing.TB, reg *template.Registry) (template.Template, string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("templates keep owners: needs root")
	}
	ctx := context.Background()
	var (
		t    template.Template
		what string
		err  error
	)
	cacheDir := template.DefaultCacheDir()
	if _, serr := os.Stat(filepath.Join(cacheDir, template.DefaultBaseSpec().CacheKey()+".tar")); serr == nil {
		// Same templates dir, the shared cache: reg's own CacheDir is
		// usually a temp dir without the debootstrap result.
		cached := &template.Registry{Dir: reg.Dir, CacheDir: cacheDir}
		t, err = cached.EnsureBase(ctx, nil)
		what = "Cube's base template (debootstrap bookworm minbase, from the cache in " + cacheDir + ")"
	} else {
		t, err = reg.ImportDir(ctx, template.BaseName, Generate(tb, 150<<20, 6000))
		what = "a generated tree (no cached debootstrap result in " + cacheDir + ")"
	}
	if err != nil {
		tb.Fatal(err)
	}
	files, bytes, err := treeSize(t.RootfsPath)
	if err != nil {
		tb.Fatal(err)
	}
	return t, fmt.Sprintf("%s: %d files, %.1f MiB", what, files, float64(bytes)/(1<<20))
}

// Generate returns a fresh directory (under tb.TempDir) of about size
// bytes in n regular files spread over n/25 directories two deep, as a
// distribution's tree is: most files small, every 50th holding half of the
// bytes between them, plus a symlink every 10th file. The content is
// pseudo-random (it does not compress) and the same on every call.
func Generate(tb testing.TB, size int64, n int) string {
	tb.Helper()
	root := filepath.Join(tb.TempDir(), "rootfs")
	src := rand.NewChaCha8([32]byte{'c', 'u', 'b', 'e'})
	rng := rand.New(src)
	big := n / 50
	bigSize := size / 2 / int64(max(big, 1))
	smallSize := (size - bigSize*int64(big)) / int64(max(n-big, 1))
	dirs := max(n/25, 1)
	buf := make([]byte, bigSize+smallSize)
	for i := range n {
		dir := filepath.Join(root, fmt.Sprintf("usr/d%03d/s%02d", i%dirs/10, i%dirs%10))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		sz := smallSize/2 + rng.Int64N(smallSize+1) // mean smallSize
		if i%50 == 0 {
			sz = bigSize
		}
		src.Read(buf[:sz])
		name := filepath.Join(dir, fmt.Sprintf("f%05d", i))
		if err := os.WriteFile(name, buf[:sz], 0o644); err != nil {
			tb.Fatal(err)
		}
		if i%10 == 0 {
			if err := os.Symlink(filepath.Base(name), name+".link"); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return root
}

// ChangeSize is the bytes Change adds: a small layer next to Base.
const ChangeSize = 4 << 20

// Change changes a LinkTree copy of a template's rootfs as a small commit
// does: ChangeSize bytes in 8 new files under /opt/bench-layer and a
// rewritten /etc/hosts (which every registered template has). Files are
// replaced, never written through: they are hard links into the parent.
func Change(tb testing.TB, root string) {
	tb.Helper()
	dir := filepath.Join(root, "opt/bench-layer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	src := rand.NewChaCha8([32]byte{'l', 'a', 'y', 'e', 'r'})
	buf := make([]byte, ChangeSize/8)
	for i := range 8 {
		src.Read(buf)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("part-%d", i)), buf, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	hosts := filepath.Join(root, "etc/hosts")
	if err := os.Remove(hosts); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(hosts, []byte("127.0.0.1\tlocalhost\n10.0.0.2\tdb\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// treeSize counts the regular files under root and their bytes.
func treeSize(root string) (files int, bytes int64, err error) {
	err = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		files++
		bytes += fi.Size()
		return nil
	})
	return files, bytes, err
}
