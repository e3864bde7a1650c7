package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestCubeletImageCanMakeSandboxes unpacks the cubelet image as a runtime
// would and, chrooted into it, runs what the cubelet needs on a node:
// mkfs.ext4 for a sandbox disk with a size limit (checked with e2fsck),
// debootstrap with what it calls for the base template (wget, gpgv, the
// Debian keyring, an apt source naming the mirror), ip, and cube itself.
// No network: debootstrap is only asked for its version.
func TestCubeletImageCanMakeSandboxes(t *testing.T) {
	buildAll(t)
	root := unpack(t, filepath.Join(built.out, "cubelet"))
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(root, "tmp", "disk.ext4")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 32<<20); err != nil {
		t.Fatal(err)
	}
	run := func(argv ...string) string {
		t.Helper()
		// Through the image's shell, so commands are looked up in the
		// image's PATH (exec.Command would search the host's).
		cmd := exec.Command("/bin/sh", append([]string{"-c", `exec "$@"`, "sh"}, argv...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		// The image's own environment, as the runtime gives it to the
		// cubelet: a PATH without /usr/sbin once hid debootstrap and
		// mkfs.ext4 from it (found on the first real cluster).
		cmd.Env = append(slices.Clone(specByName(t, "cubelet").Env), "LC_ALL=C")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("chroot %s: %v: %v\n%s", root, argv, err, out)
		}
		return string(out)
	}
	run("mkfs.ext4", "-F", "-q", "-E", "root_owner=0:0", "/tmp/disk.ext4")
	if out := run("e2fsck", "-fn", "/tmp/disk.ext4"); !strings.Contains(out, "clean") && !strings.Contains(out, "files") {
		t.Errorf("e2fsck of the new disk: %s", out)
	}
	if out := run("debootstrap", "--version"); !strings.HasPrefix(out, "debootstrap 1.") {
		t.Errorf("debootstrap --version: %q", out)
	}
	run("wget", "--version")
	run("gpgv", "--version")
	run("ip", "-V")
	if out := run("cube", "version"); !strings.Contains(out, "v9.8.7") {
		t.Errorf("cube version: %q", out)
	}
	for _, f := range []string{
		"usr/share/keyrings/debian-archive-keyring.gpg", // debootstrap checks the Release signature
		"usr/share/debootstrap/scripts/bookworm",
		"etc/ssl/certs/ca-certificates.crt",
		"usr/bin/nsenter", // the share-mounts init container enters the host's mount namespace with it
		"usr/local/bin/envd", "usr/local/bin/cube-shim", "usr/local/bin/cube-supervisor", "usr/local/bin/cube-reaper", "usr/local/bin/cube-nsexec",
		"usr/local/bin/cube-interp",
	} {
		if _, err := os.Stat(filepath.Join(root, f)); err != nil {
			t.Errorf("cubelet image: %v", err)
		}
	}
	// The cubelet debootstraps `base` from the mirror in the image's apt
	// sources (internal/template.DebianMirror).
	sources, err := os.ReadFile(filepath.Join(root, "etc/apt/sources.list"))
	if err != nil || !strings.Contains(string(sources), built.deb.Mirror) {
		t.Errorf("/etc/apt/sources.list %q (%v), want the mirror %s", sources, err, built.deb.Mirror)
	}
	// Nothing of the build host: its hostname and resolver are not baked in.
	for _, f := range []string{"etc/hostname", "etc/resolv.conf"} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err == nil && len(b) > 0 {
			t.Errorf("%s holds the build host's %q", f, b)
		}
	}
}

// TestSmallImagesHaveTheirPackages checks the other three images the same
// way: a shell, CA roots where the Dockerfile installs them, cube.
func TestSmallImagesHaveTheirPackages(t *testing.T) {
	buildAll(t)
	for _, name := range []string{"cube-server", "node-init", "installer"} {
		t.Run(name, func(t *testing.T) {
			root := unpack(t, filepath.Join(built.out, name))
			cmd := exec.Command("/bin/bash", "-c", "/usr/local/bin/cube version && ls /usr/bin/nsenter")
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
			cmd.Dir = "/"
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("chroot: %v\n%s", err, out)
			}
			_, err := os.Stat(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
			if want := slices.Contains(specByName(t, name).Packages, "ca-certificates"); want != (err == nil) {
				t.Errorf("CA roots present: %t, want %t", err == nil, want)
			}
			if _, err := os.Stat(filepath.Join(root, "usr/sbin/debootstrap")); err == nil {
				t.Errorf("%s has debootstrap, which only the cubelet image installs", name)
			}
		})
	}
}

// TestSpecsMatchDockerfiles keeps the packages of each image equal to what
// deploy/images/<name>/Dockerfile installs.
func TestSpecsMatchDockerfiles(t *testing.T) {
	install := regexp.MustCompile(`apt-get install -y --no-install-recommends((?:\s|\\\n)+[a-z0-9.+-]+(?:(?:\s|\\\n)+[a-z0-9.+-]+)*)`)
	for _, spec := range Specs("v1") {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "images", spec.Name, "Dockerfile"))
		if err != nil {
			t.Fatal(err)
		}
		var pkgs []string
		for _, m := range install.FindAllStringSubmatch(string(b), -1) {
			for _, f := range strings.Fields(strings.ReplaceAll(m[1], "\\", " ")) {
				pkgs = append(pkgs, f)
			}
		}
		slices.Sort(pkgs)
		if !slices.Equal(pkgs, sortedCopy(spec.Packages)) {
			t.Errorf("%s: Dockerfile installs %q, hack/images %q", spec.Name, pkgs, sortedCopy(spec.Packages))
		}
		if !strings.Contains(string(b), "FROM debian:bookworm-slim") {
			t.Errorf("%s: Dockerfile no longer FROM debian:bookworm-slim; hack/images debootstraps bookworm", spec.Name)
		}
	}
}

// TestDiffLayer stacks a tree tar and the diff to a changed tree the way a
// runtime does and checks that the result is the changed tree: changed,
// new and removed files and directories, a symlink retargeted, and a
// hard-link group of which one name changed.
func TestDiffLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (file owners)")
	}
	tmp := t.TempDir()
	a, b := filepath.Join(tmp, "a"), filepath.Join(tmp, "b")
	mk := func(root string, files map[string]string, links map[string]string, hard [][2]string) {
		for p, c := range files {
			if strings.HasSuffix(p, "/") {
				must(t, os.MkdirAll(filepath.Join(root, p), 0o755))
				continue
			}
			must(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
			must(t, os.WriteFile(filepath.Join(root, p), []byte(c), 0o644))
		}
		for p, target := range links {
			must(t, os.Symlink(target, filepath.Join(root, p)))
		}
		for _, h := range hard {
			must(t, os.Link(filepath.Join(root, h[0]), filepath.Join(root, h[1])))
		}
	}
	mk(a, map[string]string{"same": "1", "changed": "old", "gone": "x", "olddir/f": "y", "olddir/sub/g": "z", "keep/h1": "h", "empty/": ""},
		map[string]string{"ln": "same"}, [][2]string{{"keep/h1", "keep/h2"}})
	mk(b, map[string]string{"same": "1", "changed": "new", "newdir/n": "n", "keep/h1": "H", "empty/": ""},
		map[string]string{"ln": "changed"}, [][2]string{{"keep/h1", "keep/h2"}})
	must(t, os.Chmod(filepath.Join(b, "same"), 0o600)) // mode-only change
	ta, tb := filepath.Join(tmp, "a.tar"), filepath.Join(tmp, "b.tar")
	ctx := context.Background()
	must(t, writeFileAtomic(ta, func(w io.Writer) error { return writeTreeTar(ctx, a, w) }))
	must(t, writeFileAtomic(tb, func(w io.Writer) error { return writeTreeTar(ctx, b, w) }))
	da, db := filepath.Join(tmp, "a.tar.gz"), filepath.Join(tmp, "diff.tar.gz")
	must(t, writeFileAtomic(da, func(w io.Writer) error { return gzipTar(w, ta) }))
	must(t, writeFileAtomic(db, func(w io.Writer) error { return gzipDiff(w, ta, tb) }))

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	for _, f := range []string{da, db} {
		l, err := tarball.LayerFromFile(f, tarball.WithMediaType(types.OCILayer))
		must(t, err)
		img, err = mutate.AppendLayers(img, l)
		must(t, err)
	}
	got := flatten(t, img)
	want := flatten(t, mustLayerImage(t, tb))
	if !slices.Equal(got, want) {
		t.Errorf("base + diff:\n%s\nwant the changed tree:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The diff holds only what changed, not the unchanged file.
	l, err := tarball.LayerFromFile(db)
	must(t, err)
	u, err := l.Uncompressed()
	must(t, err)
	defer u.Close()
	names := tarNames(t, u)
	for _, n := range []string{".wh.gone", ".wh.olddir", "changed", "same", "keep/h1", "keep/h2", "ln", "newdir/", "newdir/n"} {
		if !slices.Contains(names, n) {
			t.Errorf("diff lacks %s: %q", n, names)
		}
	}
	for _, n := range []string{"empty/", "olddir/.wh.f", "olddir/sub/.wh.g"} {
		if slices.Contains(names, n) {
			t.Errorf("diff has %s, which did not change or is covered: %q", n, names)
		}
	}

	// Same inputs, same blob.
	again := filepath.Join(tmp, "again.tar.gz")
	must(t, writeFileAtomic(again, func(w io.Writer) error { return gzipDiff(w, ta, tb) }))
	x, _ := os.ReadFile(db)
	y, _ := os.ReadFile(again)
	if !bytes.Equal(x, y) {
		t.Error("the diff of the same trees differs between runs")
	}
}

func mustLayerImage(t *testing.T, tarFile string) v1.Image {
	t.Helper()
	l, err := tarball.LayerFromFile(tarFile, tarball.WithMediaType(types.OCILayer))
	must(t, err)
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), l)
	must(t, err)
	return img
}

// flatten lists the image's file system as "name type mode uid:gid
// content-or-link" lines, sorted.
func flatten(t *testing.T, img v1.Image) []string {
	t.Helper()
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	must(t, extractTar(rc, root))
	var out []string
	must(t, filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fi.Sys().(*syscall.Stat_t)
		line := rel + " " + fi.Mode().String() + " " + strconv.Itoa(int(st.Uid)) + ":" + strconv.Itoa(int(st.Gid))
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode().IsRegular():
			c, _ := os.ReadFile(p)
			line += " " + string(c) + " links=" + strconv.Itoa(int(st.Nlink))
		}
		out = append(out, line)
		return nil
	}))
	slices.Sort(out)
	return out
}

func tarNames(t *testing.T, r io.Reader) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		must(t, err)
		names = append(names, h.Name)
	}
}

// extractTar writes a flattened image stream into root: directories,
// files, symlinks and hard links with their modes and owners.
func extractTar(r io.Reader, root string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean("/" + h.Name)
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			_ = os.RemoveAll(p)
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.RemoveAll(p)
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
			if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
				return err
			}
			continue
		case tar.TypeLink:
			_ = os.RemoveAll(p)
			if err := os.Link(filepath.Join(root, filepath.Clean("/"+h.Linkname)), p); err != nil {
				return err
			}
			continue
		default:
			continue
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			return err
		}
		if err := os.Chmod(p, h.FileInfo().Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
			return err
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
