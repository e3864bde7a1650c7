package template

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTarKeepsXattrs: WriteTar records xattrs as PAX SCHILYXATTR records
// (binary values too, on the root, a directory, a file and its hard link),
// extraction sets them, XattrDigest agrees between the trees and Digest
// ignores xattrs; the root's mtime is kept too. Runs without root (user.* xattrs on own files).
func TestTarKeepsXattrs(t *testing.T) {
	ctx := testCtx(t)
	src := filepath.Join(t.TempDir(), "src")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "d"), 0o755))
	must(os.WriteFile(filepath.Join(src, "d/f"), []byte("content"), 0o644))
	must(os.Link(filepath.Join(src, "d/f"), filepath.Join(src, "hl")))
	must(os.Symlink("d/f", filepath.Join(src, "sl")))
	if d, err := XattrDigest(ctx, src); err != nil || d != "" {
		t.Fatalf("XattrDigest of a tree without xattrs = %q, %v; want \"\"", d, err)
	}
	set := map[string]map[string]string{
		"":    {"user.root": "r"},
		"d":   {"user.dir": "x"},
		"d/f": {"user.a": "1", "user.bin": "\x00\x01\xff"},
	}
	for p, xs := range set {
		for k, v := range xs {
			if err := unix.Lsetxattr(filepath.Join(src, p), k, []byte(v), 0); err != nil {
				if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
					t.Skipf("the test filesystem keeps no user.* xattrs: %v", err)
				}
				t.Fatal(err)
			}
		}
	}
	stamp := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	must(os.Chtimes(src, stamp, stamp))
	var buf bytes.Buffer
	must(WriteTar(ctx, src, &buf))
	recs := map[string]map[string]string{}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		must(err)
		for k, v := range h.PAXRecords {
			if rest, ok := cutXattr(k); ok {
				if recs[h.Name] == nil {
					recs[h.Name] = map[string]string{}
				}
				recs[h.Name][rest] = v
			}
		}
	}
	// The hard link shares the inode: its entry is a link, without records.
	want := map[string]map[string]string{"./": set[""], "./d/": set["d"], "./d/f": set["d/f"]}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("xattr records %q, want %q", recs, want)
	}

	dst := filepath.Join(t.TempDir(), "dst")
	must(os.Mkdir(dst, 0o700))
	must(extractTar(ctx, bytes.NewReader(buf.Bytes()), dst))
	for p, xs := range set {
		got, err := readXattrs(filepath.Join(dst, p))
		must(err)
		if !reflect.DeepEqual(got, xs) {
			t.Errorf("%q: xattrs %q, want %q", p, got, xs)
		}
	}
	fi, err := os.Stat(dst)
	must(err)
	if !fi.ModTime().Equal(stamp) {
		t.Errorf("root mtime %v, want %v", fi.ModTime(), stamp)
	}
	if got, err := readXattrs(filepath.Join(dst, "hl")); err != nil || !reflect.DeepEqual(got, set["d/f"]) {
		t.Errorf("hard link: xattrs %q, %v", got, err)
	}
	ds, err := XattrDigest(ctx, src)
	must(err)
	dd, err := XattrDigest(ctx, dst)
	must(err)
	if ds == "" || ds != dd || ValidateDigest(ds) != nil {
		t.Fatalf("XattrDigest src %q, dst %q", ds, dd)
	}
	s1, err := Digest(ctx, src)
	must(err)
	must(unix.Lsetxattr(filepath.Join(src, "d/f"), "user.a", []byte("changed"), 0))
	s2, err := Digest(ctx, src)
	must(err)
	if s1 != s2 {
		t.Fatal("Digest changed with an xattr: recorded digests of older templates would no longer verify")
	}
	if d, _ := XattrDigest(ctx, src); d == ds {
		t.Fatal("XattrDigest did not change with an xattr value")
	}
}

func cutXattr(k string) (string, bool) {
	if len(k) > len(paxXattr) && k[:len(paxXattr)] == paxXattr {
		return k[len(paxXattr):], true
	}
	return "", false
}

// TestCarriedXattr: security.selinux stays behind, the rest travels.
func TestCarriedXattr(t *testing.T) {
	for name, want := range map[string]bool{"security.selinux": false, "security.capability": true,
		"user.x": true, "trusted.y": true, "system.posix_acl_access": true} {
		if got := carriedXattr(name); got != want {
			t.Errorf("carriedXattr(%q) = %v", name, got)
		}
	}
}
