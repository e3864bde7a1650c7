package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func newTestRegistry(t *testing.T) *Registry {
	t.Helper()
	return &Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: filepath.Join(t.TempDir(), "cache")}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (file owners)")
	}
}

// writeTree creates a small rootfs-like source directory.
func writeTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "srv/private"), 0o750))
	must(os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\nshadow:x:42:\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "usr/bin/tool"), []byte("#!/bin/sh\necho hi\n"), 0o4755))
	must(os.Chmod(filepath.Join(dir, "usr/bin/tool"), os.ModeSetuid|0o755))
	must(os.WriteFile(filepath.Join(dir, "srv/private/data"), []byte("secret"), 0o600))
	must(os.Chown(filepath.Join(dir, "srv/private"), 33, 44))
	must(os.Chown(filepath.Join(dir, "srv/private/data"), 33, 44))
	must(os.Link(filepath.Join(dir, "usr/bin/tool"), filepath.Join(dir, "usr/bin/tool2")))
	must(os.Symlink("usr/bin", filepath.Join(dir, "bin")))
	must(os.Symlink("/etc/shadow", filepath.Join(dir, "hostlink"))) // dangling in the copy: must stay a link
	must(syscall.Mkfifo(filepath.Join(dir, "srv/fifo"), 0o620))
	must(os.Chmod(filepath.Join(dir, "srv/fifo"), 0o620))
	must(syscall.Mknod(filepath.Join(dir, "srv/null"), syscall.S_IFCHR|0o666, 1<<8|3))
	return dir
}

func TestValidateName(t *testing.T) {
	good := []string{"base", "a", "0", "my-template_1.2", strings.Repeat("a", 63)}
	bad := []string{"", "Base", "-x", ".x", "_x", "a/b", "../x", "a b", strings.Repeat("a", 64), "é"}
	for _, n := range good {
		if err := ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q) = %v", n, err)
		}
	}
	r := newTestRegistry(t)
	ctx := testCtx(t)
	for _, n := range bad {
		if err := ValidateName(n); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidArgument", n, err)
		}
		if _, err := r.ImportDir(ctx, n, t.TempDir()); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ImportDir(%q) = %v, want ErrInvalidArgument", n, err)
		}
		if _, err := r.Get(ctx, n); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Get(%q) = %v, want ErrInvalidArgument", n, err)
		}
	}
}

func TestImportDir(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	src := writeTree(t)
	tpl, err := r.ImportDir(ctx, "small", src)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Name != "small" || tpl.CPUCount != 2 || tpl.MemoryMB != 512 || tpl.DiskSizeMB != 1024 ||
		!strings.HasPrefix(tpl.Digest, "sha256:") || tpl.Source != "dir:"+src || tpl.CreatedAt.IsZero() {
		t.Errorf("metadata: %+v", tpl)
	}
	if tpl.RootfsPath != filepath.Join(r.Dir, "small", "rootfs") {
		t.Errorf("RootfsPath = %s", tpl.RootfsPath)
	}
	root := tpl.RootfsPath
	checkMode(t, filepath.Join(root, "usr/bin/tool"), os.ModeSetuid|0o755, 0, 0)
	checkMode(t, filepath.Join(root, "srv/private"), os.ModeDir|0o750, 33, 44)
	checkMode(t, filepath.Join(root, "srv/private/data"), 0o600, 33, 44)
	checkMode(t, filepath.Join(root, "srv/fifo"), os.ModeNamedPipe|0o620, 0, 0)
	if l, err := os.Readlink(filepath.Join(root, "bin")); err != nil || l != "usr/bin" {
		t.Errorf("bin symlink = %q, %v", l, err)
	}
	if l, err := os.Readlink(filepath.Join(root, "hostlink")); err != nil || l != "/etc/shadow" {
		t.Errorf("hostlink = %q, %v", l, err)
	}
	if _, err := os.Lstat(filepath.Join(root, "srv/null")); !os.IsNotExist(err) {
		t.Errorf("device node copied: %v", err)
	}
	a, _ := os.Stat(filepath.Join(root, "usr/bin/tool"))
	b, _ := os.Stat(filepath.Join(root, "usr/bin/tool2"))
	if !os.SameFile(a, b) {
		t.Error("hard link not preserved")
	}
	checkPrepared(t, root, "/bin/sh")

	// Same content, same digest; Get returns what ImportDir returned.
	tpl2, err := r.ImportDir(ctx, "small2", src)
	if err != nil {
		t.Fatal(err)
	}
	if tpl2.Digest != tpl.Digest {
		t.Errorf("digest not deterministic: %s vs %s", tpl.Digest, tpl2.Digest)
	}
	got, err := r.Get(ctx, "small")
	if err != nil || !reflect.DeepEqual(got, tpl) {
		t.Errorf("Get = %+v, %v; want %+v", got, err, tpl)
	}
	// A change in content changes the digest.
	if err := os.WriteFile(filepath.Join(src, "etc/extra"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl3, err := r.ImportDir(ctx, "small3", src)
	if err != nil {
		t.Fatal(err)
	}
	if tpl3.Digest == tpl.Digest {
		t.Error("digest did not change with content")
	}

	if _, err := r.ImportDir(ctx, "small", src); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("re-import = %v, want ErrAlreadyExists", err)
	}
	if _, err := r.ImportDir(ctx, "missing", filepath.Join(src, "nope")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("import of missing dir = %v, want ErrNotFound", err)
	}
	if _, err := r.ImportDir(ctx, "file", filepath.Join(src, "etc/passwd")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("import of a file = %v, want ErrInvalidArgument", err)
	}
	assertNoStaging(t, r)
}

func TestListGetDelete(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	if l, err := r.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("List on empty registry = %v, %v", l, err)
	}
	if _, err := r.Get(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get missing = %v, want ErrNotFound", err)
	}
	if err := r.Delete(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Delete missing = %v, want ErrNotFound", err)
	}
	src := t.TempDir()
	for _, n := range []string{"zeta", "alpha"} {
		if _, err := r.ImportDir(ctx, n, src); err != nil {
			t.Fatal(err)
		}
	}
	// Junk that List must ignore.
	_ = os.MkdirAll(filepath.Join(r.Dir, "broken", "rootfs"), 0o755)
	_ = os.MkdirAll(filepath.Join(r.Dir, ".tmp-x-0123456789abcdef"), 0o755)
	l, err := r.List(ctx)
	if err != nil || len(l) != 2 || l[0].Name != "alpha" || l[1].Name != "zeta" {
		t.Fatalf("List = %+v, %v", l, err)
	}
	if err := r.Delete(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(ctx, "alpha"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after delete = %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.Dir, "alpha")); !os.IsNotExist(err) {
		t.Errorf("directory left after delete: %v", err)
	}
	// The name is free again.
	if _, err := r.ImportDir(ctx, "alpha", src); err != nil {
		t.Errorf("re-import after delete: %v", err)
	}
	// A corrupt template.json is an error for Get and skipped by List.
	_ = os.WriteFile(filepath.Join(r.Dir, "broken", "template.json"), []byte("{"), 0o644)
	if _, err := r.Get(ctx, "broken"); err == nil {
		t.Error("Get of corrupt template succeeded")
	}
	if l, err := r.List(ctx); err != nil || len(l) != 2 {
		t.Errorf("List with corrupt entry = %+v, %v", l, err)
	}
}

func TestStaleStagingRemoved(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	stale := filepath.Join(r.Dir, ".tmp-crashy-0123456789abcdef")
	other := filepath.Join(r.Dir, ".tmp-crashy2-0123456789abcdef") // another name's build: untouched
	for _, d := range []string{stale, other} {
		if err := os.MkdirAll(filepath.Join(d, "rootfs/etc"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A crashed debootstrap can leave proc mounted inside its target.
	mnt := filepath.Join(stale, "rootfs/proc")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(ctx, "crashy"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a staging dir must not be visible: %v", err)
	}
	if _, err := r.ImportDir(ctx, "crashy", t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale staging dir not removed: %v", err)
	}
	if m, _ := mountsUnder(stale); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("other name's staging dir removed: %v", err)
	}
}

func TestConcurrentImportSameName(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	src := writeTree(t)
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = r.ImportDir(ctx, "race", src)
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errdefs.ErrAlreadyExists):
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 1 {
		t.Errorf("%d imports succeeded, want 1", ok)
	}
	assertNoStaging(t, r)
}

func TestContextCanceled(t *testing.T) {
	requireRoot(t)
	r := newTestRegistry(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.ImportDir(ctx, "x", writeTree(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("ImportDir with canceled ctx = %v", err)
	}
	if _, err := r.Get(context.Background(), "x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("canceled import left a template: %v", err)
	}
}

func checkMode(t *testing.T, path string, mode os.FileMode, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	want := mode
	if fi.Mode() != want || st.Uid != uid || st.Gid != gid {
		t.Errorf("%s: mode %v uid %d gid %d; want %v %d %d", path, fi.Mode(), st.Uid, st.Gid, want, uid, gid)
	}
}

// checkPrepared asserts what PrepareRootfs guarantees.
func checkPrepared(t *testing.T, root, shell string) {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Errorf("read %s: %v", p, err)
		}
		return string(b)
	}
	passwd := read("etc/passwd")
	for _, want := range []string{"root:x:0:0:root:/root:", "user:x:1000:1000::/home/user:" + shell + "\n"} {
		if !strings.Contains(passwd, want) {
			t.Errorf("etc/passwd lacks %q:\n%s", want, passwd)
		}
	}
	group := read("etc/group")
	for _, want := range []string{"root:x:0:", "user:x:1000:"} {
		if !strings.Contains(group, want) {
			t.Errorf("etc/group lacks %q:\n%s", want, group)
		}
	}
	shadow := read("etc/shadow")
	for _, want := range []string{"\nuser:*:", "root:"} {
		if !strings.Contains("\n"+shadow, want) {
			t.Errorf("etc/shadow lacks %q:\n%s", want, shadow)
		}
	}
	fi, err := os.Stat(filepath.Join(root, "etc/shadow"))
	if err == nil && fi.Mode().Perm() != 0o640 && fi.Mode().Perm() != 0o600 {
		t.Errorf("etc/shadow mode %v", fi.Mode())
	}
	checkMode(t, filepath.Join(root, "home/user"), os.ModeDir|0o755, 1000, 1000)
	checkMode(t, filepath.Join(root, "tmp"), os.ModeDir|os.ModeSticky|0o777, 0, 0)
	checkMode(t, filepath.Join(root, ".cube"), os.ModeDir|0o755, 0, 0)
	for _, f := range []string{"etc/hostname", "etc/hosts", "etc/resolv.conf"} {
		fi, err := os.Lstat(filepath.Join(root, f))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s is not a regular file: %v %v", f, fi, err)
		}
	}
}

func assertNoStaging(t *testing.T, r *Registry) {
	t.Helper()
	entries, _ := os.ReadDir(r.Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) || strings.HasPrefix(e.Name(), delPrefix) {
			t.Errorf("leftover %s", e.Name())
		}
	}
}

func TestCleanup(t *testing.T) {
	ctx := testCtx(t)
	r := newTestRegistry(t)
	if err := r.Cleanup(ctx); err != nil { // no dir yet
		t.Fatal(err)
	}
	stale := []string{".tmp-a-0123456789abcdef", ".del-b.c-0123456789abcdef", ".tmp-busy-0123456789abcdef"}
	keep := []string{"real", ".tmp-x", ".tmp-Bad-0123456789abcdef", ".lock-zzz"}
	for _, d := range append(append([]string{}, stale...), keep...) {
		if err := os.MkdirAll(filepath.Join(r.Dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	unlock, err := r.lock(ctx, "busy") // a build of "busy" is in progress
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if err := r.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range stale[:2] {
		if _, err := os.Stat(filepath.Join(r.Dir, d)); !os.IsNotExist(err) {
			t.Errorf("%s not removed: %v", d, err)
		}
	}
	for _, d := range append([]string{stale[2]}, keep...) {
		if _, err := os.Stat(filepath.Join(r.Dir, d)); err != nil {
			t.Errorf("%s removed: %v", d, err)
		}
	}
}
