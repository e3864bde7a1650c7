package nsrt

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
)

// TestDiskCacheCopiesAreFreshFilesystems checks that images made from the
// cache are clean ext4 filesystems of the asked size, each with its own
// UUID and hash seed, sparse, and that the formatted image is made once.
func TestDiskCacheCopiesAreFreshFilesystems(t *testing.T) {
	for _, tool := range []string{mkfsTool, "e2fsck", "dumpe2fs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s (e2fsprogs) not installed", tool)
		}
	}
	dir := t.TempDir()
	cache := NewDiskCache(filepath.Join(dir, "cache"))
	const sizeMB = 256
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = cache.Make(filepath.Join(dir, "d"+string(rune('a'+i))+".img"), sizeMB) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(filepath.Join(dir, "cache"))
	if err != nil || len(ents) != 1 {
		t.Fatalf("cache dir holds %v (%v), want one formatted image", ents, err)
	}
	ids := map[string]string{}
	for _, name := range []string{"da.img", "db.img", "dc.img", "dd.img"} {
		img := filepath.Join(dir, name)
		fi, err := os.Stat(img)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != sizeMB<<20 {
			t.Errorf("%s: size %d, want %d", name, fi.Size(), sizeMB<<20)
		}
		if st, ok := fi.Sys().(interface{ Blocks() int64 }); ok && st.Blocks()*512 > 8<<20 {
			t.Errorf("%s: %d bytes allocated, want a sparse copy", name, st.Blocks()*512)
		}
		if out, err := exec.Command("e2fsck", "-n", "-f", img).CombinedOutput(); err != nil {
			t.Errorf("e2fsck %s: %v\n%s", name, err, out)
		}
		out, err := exec.Command("dumpe2fs", "-h", img).CombinedOutput()
		if err != nil {
			t.Fatalf("dumpe2fs %s: %v\n%s", name, err, out)
		}
		for _, field := range []string{"Filesystem UUID", "Directory Hash Seed"} {
			m := regexp.MustCompile(field + `:\s+(\S+)`).FindSubmatch(out)
			if m == nil {
				t.Fatalf("%s: no %s in dumpe2fs output", name, field)
			}
			if prev, ok := ids[string(m[1])]; ok {
				t.Errorf("%s: %s %s is also %s's", name, field, m[1], prev)
			}
			ids[string(m[1])] = name
		}
	}
}

// TestDiskCacheRemakesWrongSize checks that a formatted image of the wrong
// size (a torn or foreign file) is not copied.
func TestDiskCacheRemakesWrongSize(t *testing.T) {
	if _, err := exec.LookPath(mkfsTool); err != nil {
		t.Skipf("%s (e2fsprogs) not installed", mkfsTool)
	}
	dir := t.TempDir()
	cache := NewDiskCache(dir)
	golden := filepath.Join(dir, "ext4-64M-"+diskCacheVersion+".img")
	if err := os.WriteFile(golden, []byte("torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "d.img")
	if err := cache.Make(img, 64); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("e2fsck", "-n", "-f", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck: %v\n%s", err, out)
	}
}
