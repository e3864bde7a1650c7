package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

type tarEntry struct {
	hdr  tar.Header
	body string
}

func reg(name, body string, mode int64) tarEntry {
	return tarEntry{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: time.Unix(1700000000, 0)}, body}
}

func dir(name string, mode int64) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: time.Unix(1700000000, 0)}}
}

func symlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlink(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

// writeTarFile writes entries to a .tar (or .tar.gz) file in a temp dir.
func writeTarFile(t *testing.T, gz bool, entries ...tarEntry) string {
	t.Helper()
	var buf bytes.Buffer
	var zw *gzip.Writer
	w := &buf
	tw := (*tar.Writer)(nil)
	if gz {
		zw = gzip.NewWriter(w)
		tw = tar.NewWriter(zw)
	} else {
		tw = tar.NewWriter(w)
	}
	for _, e := range entries {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	name := "rootfs.tar"
	if gz {
		name += ".gz"
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestImportTar(t *testing.T) {
	requireRoot(t)
	for _, gz := range []bool{false, true} {
		t.Run(map[bool]string{false: "tar", true: "tar.gz"}[gz], func(t *testing.T) {
			ctx := testCtx(t)
			r := newTestRegistry(t)
			owned := reg("./srv/owned", "mine", 0o640)
			owned.hdr.Uid, owned.hdr.Gid = 33, 44
			file := writeTarFile(t, gz,
				dir("./", 0o755),
				dir("./etc/", 0o755),
				reg("./etc/passwd", "root:x:0:0:root:/root:/bin/bash\n", 0o644),
				reg("/usr/bin/bash", "#!fake", 0o755), // absolute: stripped to usr/bin/bash
				symlink("bin", "usr/bin"),
				hardlink("usr/bin/sh", "usr/bin/bash"),
				reg("deep/implicit/parent/file", "x", 0o600), // parents created
				owned,
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}},
				tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "srv/fifo", Mode: 0o600}},
				symlink("etc/resolv.conf", "/run/systemd/resolve/stub-resolv.conf"),
				reg("etc/dup", "first", 0o644),
				reg("etc/dup", "second", 0o644), // later entry wins
				dir("locked/", 0o500),
				reg("locked/inside", "y", 0o644), // dir mode applied after children
			)
			tpl, err := r.ImportTar(ctx, "fromtar", file)
			if err != nil {
				t.Fatal(err)
			}
			root := tpl.RootfsPath
			if !strings.HasPrefix(tpl.Source, "tar:") {
				t.Errorf("source %q", tpl.Source)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "usr/bin/bash")); string(b) != "#!fake" {
				t.Errorf("usr/bin/bash = %q", b)
			}
			a, _ := os.Stat(filepath.Join(root, "usr/bin/bash"))
			b, _ := os.Stat(filepath.Join(root, "usr/bin/sh"))
			if !os.SameFile(a, b) {
				t.Error("hard link not created")
			}
			checkMode(t, filepath.Join(root, "srv/owned"), 0o640, 33, 44)
			checkMode(t, filepath.Join(root, "srv/fifo"), os.ModeNamedPipe|0o600, 0, 0)
			checkMode(t, filepath.Join(root, "locked"), os.ModeDir|0o500, 0, 0)
			if fi, err := os.Stat(filepath.Join(root, "usr/bin/bash")); err != nil || fi.ModTime().Unix() != 1700000000 {
				t.Errorf("mtime not applied: %v %v", fi, err)
			}
			if _, err := os.Lstat(filepath.Join(root, "dev/null")); !os.IsNotExist(err) {
				t.Errorf("device node extracted: %v", err)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "etc/dup")); string(b) != "second" {
				t.Errorf("etc/dup = %q", b)
			}
			if b, _ := os.ReadFile(filepath.Join(root, "deep/implicit/parent/file")); string(b) != "x" {
				t.Errorf("implicit parents: %q", b)
			}
			// bash exists (through the bin -> usr/bin symlink), so user gets it.
			checkPrepared(t, root, "/bin/bash")
			// resolv.conf was a symlink: now a regular file.
			if fi, err := os.Lstat(filepath.Join(root, "etc/resolv.conf")); err != nil || !fi.Mode().IsRegular() {
				t.Errorf("resolv.conf: %v %v", fi, err)
			}
		})
	}
}

// TestImportTarHostile checks that no archive can write outside the rootfs.
func TestImportTarHostile(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir() // stands in for the host filesystem
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]tarEntry{
		"dotdot":          {reg("../../../../"+victim, "pwned", 0o644)},
		"dotdot-inner":    {reg("etc/../../x", "pwned", 0o644)},
		"symlink-dir-abs": {symlink("etc", outside), reg("etc/victim", "pwned", 0o644)},
		"symlink-dir-rel": {dir("a/", 0o755), symlink("a/b", "../.."), reg("a/b/x", "pwned", 0o644)},
		// Even an in-root symlink is never followed while extracting.
		"symlink-dir-inroot": {dir("real/", 0o755), symlink("alias", "real"), reg("alias/f", "x", 0o644)},
		"hardlink-escape":    {hardlink("stolen", "../../../../etc/shadow")},
		"hardlink-via-link":  {symlink("l", outside), hardlink("stolen", "l/victim")},
		"dir-over-symlink":   {symlink("d", outside), dir("d/", 0o777)},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			r := newTestRegistry(t)
			_, err := r.ImportTar(ctx, "evil", writeTarFile(t, false, entries...))
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ImportTar = %v, want ErrInvalidArgument", err)
			}
			if b, _ := os.ReadFile(victim); string(b) != "original" {
				t.Fatalf("victim overwritten: %q", b)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("files appeared outside: %v", ents)
			}
			if fi, _ := os.Stat(outside); fi.Mode().Perm() != 0o700 && fi.Mode().Perm() != 0o755 {
				t.Errorf("outside dir mode changed: %v", fi.Mode())
			}
			if _, err := r.Get(ctx, "evil"); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("failed import registered: %v", err)
			}
			assertNoStaging(t, r)
		})
	}
}

// TestPrepareDoesNotFollowHostileLinks: a rootfs whose etc/passwd or
// home/user points outside must not make PrepareRootfs touch the host.
func TestPrepareDoesNotFollowHostileLinks(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "passwd")
	if err := os.WriteFile(victim, []byte("original\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, entries := range map[string][]tarEntry{
		"passwd":    {dir("etc/", 0o755), symlink("etc/passwd", victim)},
		"etc":       {symlink("etc", outside)},
		"home-user": {dir("home/", 0o755), symlink("home/user", outside)},
		"tmp":       {symlink("tmp", outside)},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := testCtx(t)
			r := newTestRegistry(t)
			if _, err := r.ImportTar(ctx, "evil", writeTarFile(t, false, entries...)); err == nil {
				t.Error("import succeeded")
			}
			if b, _ := os.ReadFile(victim); string(b) != "original\n" {
				t.Fatalf("victim changed: %q", b)
			}
			fi, _ := os.Stat(outside)
			if st := fi.Sys(); fi.Mode().Perm() == 0o777 || st == nil {
				t.Errorf("outside dir chmodded: %v", fi.Mode())
			}
			assertNoStaging(t, r)
		})
	}
}

func TestImportTarErrors(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	if _, err := r.ImportTar(ctx, "x", filepath.Join(t.TempDir(), "missing.tar")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing file = %v, want ErrNotFound", err)
	}
	junk := filepath.Join(t.TempDir(), "junk.tar")
	if err := os.WriteFile(junk, bytes.Repeat([]byte("not a tar "), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ImportTar(ctx, "x", junk); err == nil {
		t.Error("junk tar imported")
	}
	// Truncated gzip.
	full := writeTarFile(t, true, reg("a", strings.Repeat("z", 100000), 0o644))
	b, _ := os.ReadFile(full)
	trunc := filepath.Join(t.TempDir(), "trunc.tar.gz")
	_ = os.WriteFile(trunc, b[:len(b)/2], 0o644)
	if _, err := r.ImportTar(ctx, "x", trunc); err == nil {
		t.Error("truncated archive imported")
	}
	assertNoStaging(t, r)
	if l, _ := r.List(ctx); len(l) != 0 {
		t.Errorf("templates after failures: %+v", l)
	}
}

func TestCacheTarRoundTrip(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	src := writeTree(t)
	want, err := Digest(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "cache.tar")
	if err := writeTarCache(ctx, src, file); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := extractTarFile(ctx, file, dst); err != nil {
		t.Fatal(err)
	}
	// The device node is left out of the cache; everything else matches.
	if err := os.Remove(filepath.Join(src, "srv/null")); err != nil {
		t.Fatal(err)
	}
	want, _ = Digest(ctx, src)
	got, err := Digest(ctx, dst)
	if err != nil || got != want {
		t.Errorf("digest after round trip %s, want %s (%v)", got, want, err)
	}
}
