package template

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// fileCap is a security.capability value (VFS_CAP_REVISION_2, effective,
// permitted CAP_NET_BIND_SERVICE).
var fileCap = []byte{0x01, 0, 0, 0x02, 0x00, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// fillParent makes the parent tree: files, directories, symlinks, a hard
// link pair, a setuid file, xattrs (user.* and security.capability) and a
// FIFO, plus what the child will delete, retype and chmod.
func fillParent(ctx context.Context, rootfs string) error {
	p := func(rel string) string { return filepath.Join(rootfs, rel) }
	steps := []func() error{
		func() error { return os.MkdirAll(p("etc"), 0o755) },
		func() error { return os.WriteFile(p("etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644) },
		func() error { return os.MkdirAll(p("a"), 0o755) },
		func() error { return os.WriteFile(p("a/file1"), []byte("one"), 0o644) },
		func() error { return os.WriteFile(p("a/keep"), []byte("keep"), 0o640) },
		func() error { return os.MkdirAll(p("gone/sub"), 0o755) },
		func() error { return os.WriteFile(p("gone/sub/x"), []byte("x"), 0o644) },
		func() error { return os.WriteFile(p("gone/y"), []byte("y"), 0o644) },
		func() error { return os.MkdirAll(p("d2/inner"), 0o755) },
		func() error { return os.WriteFile(p("f2"), []byte("file to become a dir"), 0o644) },
		func() error { return os.MkdirAll(p("chm"), 0o755) },
		func() error { return os.WriteFile(p("chm/c"), []byte("c"), 0o644) },
		func() error { return os.Symlink("a/file1", p("link")) },
		func() error { return os.Symlink("/etc/shadow", p("abslink")) },
		func() error { return os.WriteFile(p("hl1"), []byte("linked"), 0o644) },
		func() error { return os.Link(p("hl1"), p("hl2")) },
		func() error { return os.MkdirAll(p("bin"), 0o755) },
		func() error { return os.WriteFile(p("bin/su"), []byte("#!/bin/sh\n"), 0o755) },
		func() error { return os.Chmod(p("bin/su"), os.ModeSetuid|0o755) },
		func() error { return os.MkdirAll(p("x"), 0o755) },
		func() error { return unix.Lsetxattr(p("x"), "user.dirattr", []byte("d"), 0) },
		func() error { return os.WriteFile(p("x/cap"), []byte("cap"), 0o755) },
		func() error { return unix.Lsetxattr(p("x/cap"), "user.note", []byte("n"), 0) },
		func() error { return unix.Lsetxattr(p("x/cap"), "security.capability", fileCap, 0) },
		func() error { return syscall.Mkfifo(p("fifo"), 0o620) },
		func() error { return os.WriteFile(p("del"), []byte("deleted"), 0o644) },
		func() error { return os.WriteFile(p("rewrite"), []byte("old"), 0o644) },
		func() error { return os.Chown(p("a/keep"), 33, 44) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// changeChild makes the child's changes on a LinkTree copy of the parent,
// never writing through a link: new, rewritten and deleted files, a
// deleted directory with content, file -> dir, dir -> symlink, a chmod of a
// directory, new hard links (to a parent file, and a new pair).
func changeChild(rootfs string) error {
	p := func(rel string) string { return filepath.Join(rootfs, rel) }
	steps := []func() error{
		func() error { return os.WriteFile(p("a/new"), []byte("new"), 0o600) },
		func() error { return unix.Lsetxattr(p("a/new"), "user.fresh", []byte("f"), 0) },
		func() error { return os.Link(p("a/new"), p("a/new2")) },
		func() error { return os.Remove(p("rewrite")) },
		func() error { return os.WriteFile(p("rewrite"), []byte("rewritten"), 0o644) },
		func() error { return os.Remove(p("del")) },
		func() error { return os.RemoveAll(p("gone")) },
		func() error { return os.Remove(p("f2")) },
		func() error { return os.Mkdir(p("f2"), 0o711) },
		func() error { return os.WriteFile(p("f2/inside"), []byte("in"), 0o644) },
		func() error { return os.RemoveAll(p("d2")) },
		func() error { return os.Symlink("a", p("d2")) },
		func() error { return os.Chmod(p("chm"), 0o700) },
		func() error { return os.Link(p("a/keep"), p("a/keeplink")) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// inodes maps every non-directory of the tree to its inode.
func inodes(t *testing.T, root string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	err := filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		out[path] = fi.Sys().(*syscall.Stat_t).Ino
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func ino(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func countingOpener(b []byte, opened *int) func(context.Context) (io.ReadCloser, error) {
	return func(context.Context) (io.ReadCloser, error) {
		*opened++
		return io.NopCloser(bytes.NewReader(b)), nil
	}
}

// registerParentChild registers "parent" (flat) and "child" (parent plus
// changes, layered) in r.
func registerParentChild(t *testing.T, ctx context.Context, r *Registry) (Template, Template) {
	t.Helper()
	parent, err := r.Register(ctx, "parent", Meta{}, fillParent)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			t.Skipf("the test filesystem keeps no xattrs: %v", err)
		}
		t.Fatal(err)
	}
	child, err := r.Register(ctx, "child", Meta{Parent: &parent, CPUCount: 3, Source: "commit:test"}, func(ctx context.Context, rootfs string) error {
		if err := LinkTree(ctx, parent.RootfsPath, rootfs); err != nil {
			return err
		}
		return changeChild(rootfs)
	})
	if err != nil {
		t.Fatal(err)
	}
	return parent, child
}

// TestLayeredTemplate: a template registered with a Parent stores the
// difference as <name>/layer (links, whiteouts, changed directories only)
// with Layers = parent's chain + that layer; its layer tar is
// deterministic; a second registry holding only the parent makes the same
// template from the tar (same Digest and XattrDigest, unchanged files
// shared with its parent); the parents are never written through.
func TestLayeredTemplate(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	parent, child := registerParentChild(t, ctx, r)
	parentInodes := inodes(t, parent.RootfsPath)

	if len(parent.Layers) != 0 || !reflect.DeepEqual(parent.LayerChain(), []LayerRef{{Digest: parent.Digest}}) || parent.TopLayerDir() != parent.RootfsPath {
		t.Fatalf("flat parent: layers %+v, chain %+v, top %s", parent.Layers, parent.LayerChain(), parent.TopLayerDir())
	}
	if b, _ := os.ReadFile(filepath.Join(r.Dir, "parent", metaFile)); strings.Contains(string(b), "layers") {
		t.Fatalf("a flat template.json has layers: %s", b)
	}
	if len(child.Layers) != 2 || child.Layers[0].Digest != parent.Digest || child.CPUCount != 3 {
		t.Fatalf("child %+v", child)
	}
	top := child.TopLayerDir()
	if top != filepath.Join(r.Dir, "child", layerDir) {
		t.Fatalf("top layer dir %s", top)
	}
	if d, err := Digest(ctx, top); err != nil || d != child.Layers[1].Digest {
		t.Fatalf("layer digest %s (%v), recorded %s", d, err, child.Layers[1].Digest)
	}
	if want := int64(len("new") + len("rewritten") + len("in") + len("keep")); child.Layers[1].Size < want {
		t.Errorf("layer size %d, want at least %d", child.Layers[1].Size, want)
	}
	got, err := r.Get(ctx, "child")
	if err != nil || !reflect.DeepEqual(got.Layers, child.Layers) {
		t.Fatalf("read back %+v, %v", got, err)
	}
	checkLayerDir(t, top, child.RootfsPath)

	// The layer tar is deterministic.
	var tar1, tar2 bytes.Buffer
	if err := WriteLayerTar(ctx, top, &tar1); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayerTar(ctx, top, &tar2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tar1.Bytes(), tar2.Bytes()) {
		t.Fatal("two tars of one layer differ")
	}

	// A second registry holding only the parent.
	r2 := newTestRegistry(t)
	parentXD, err := XattrDigest(ctx, parent.RootfsPath)
	if err != nil || parentXD == "" {
		t.Fatalf("parent xattr digest %q, %v", parentXD, err)
	}
	var ptar bytes.Buffer
	if err := WriteTar(ctx, parent.RootfsPath, &ptar); err != nil {
		t.Fatal(err)
	}
	parent2, err := r2.ImportStream(ctx, "parent", &ptar, Published{Digest: parent.Digest, XattrDigest: parentXD})
	if err != nil {
		t.Fatal(err)
	}
	parent2Inodes := inodes(t, parent2.RootfsPath)
	childXD, err := XattrDigest(ctx, child.RootfsPath)
	if err != nil {
		t.Fatal(err)
	}
	pub := Published{Digest: child.Digest, XattrDigest: childXD, Layers: child.Layers, CPUCount: 3, MemoryMB: 640,
		Defaults: &Defaults{Workdir: "/srv"}}
	opened := 0
	src := []LayerSource{{Ref: child.Layers[1], Open: countingOpener(tar1.Bytes(), &opened)}}
	child2, err := r2.ImportLayers(ctx, "child", parent2, src, pub)
	if err != nil {
		t.Fatal(err)
	}
	if child2.Digest != child.Digest || !reflect.DeepEqual(child2.Layers, child.Layers) || child2.MemoryMB != 640 ||
		child2.Defaults == nil || child2.Defaults.Workdir != "/srv" || opened != 1 {
		t.Fatalf("imported %+v (opened %d), want digest %s layers %+v", child2, opened, child.Digest, child.Layers)
	}
	if d, err := Digest(ctx, child2.RootfsPath); err != nil || d != child.Digest {
		t.Fatalf("imported rootfs digest %s, %v", d, err)
	}
	if xd, err := XattrDigest(ctx, child2.RootfsPath); err != nil || xd != childXD {
		t.Fatalf("imported xattr digest %s, %v; want %s", xd, err, childXD)
	}
	if d, err := Digest(ctx, child2.TopLayerDir()); err != nil || d != child.Layers[1].Digest {
		t.Fatalf("imported layer dir digest %s, %v", d, err)
	}
	// Unchanged files share the parent's inode; the new pair stays a pair.
	for _, f := range []string{"a/keep", "hl1", "x/cap", "bin/su", "link"} {
		if ino(t, filepath.Join(child2.RootfsPath, f)) != ino(t, filepath.Join(parent2.RootfsPath, f)) {
			t.Errorf("%s: not shared with the parent", f)
		}
	}
	if ino(t, filepath.Join(child2.RootfsPath, "a/new")) != ino(t, filepath.Join(child2.RootfsPath, "a/new2")) {
		t.Error("a/new and a/new2 are no longer one file")
	}
	if b, _ := os.ReadFile(filepath.Join(child2.RootfsPath, "rewrite")); string(b) != "rewritten" {
		t.Errorf("rewrite: %q", b)
	}
	for _, f := range []string{"del", "gone", "d2/inner"} {
		if _, err := os.Lstat(filepath.Join(child2.RootfsPath, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there: %v", f, err)
		}
	}
	// A second import of the name opens nothing.
	if _, err := r2.ImportLayers(ctx, "child", parent2, src, pub); !errors.Is(err, errdefs.ErrAlreadyExists) || opened != 1 {
		t.Fatalf("again: %v (opened %d)", err, opened)
	}

	// The parents are untouched: same content, same inodes.
	for root, before := range map[string]map[string]uint64{parent.RootfsPath: parentInodes, parent2.RootfsPath: parent2Inodes} {
		if after := inodes(t, root); !reflect.DeepEqual(before, after) {
			t.Errorf("%s: inodes changed", root)
		}
		if d, err := Digest(ctx, root); err != nil || d != parent.Digest {
			t.Errorf("%s: digest %s, %v", root, d, err)
		}
		if xd, _ := XattrDigest(ctx, root); xd != parentXD {
			t.Errorf("%s: xattr digest %s", root, xd)
		}
	}

	// A layered template outlives its parent (hard links keep the data).
	if err := r2.Delete(ctx, "parent"); err != nil {
		t.Fatal(err)
	}
	if d, err := Digest(ctx, child2.RootfsPath); err != nil || d != child.Digest {
		t.Fatalf("after the parent's delete: %s, %v", d, err)
	}
}

// checkLayerDir checks what the child's layer holds.
func checkLayerDir(t *testing.T, layer, rootfs string) {
	t.Helper()
	for _, f := range []string{"a/new", "a/new2", "a/keeplink", "rewrite", "f2/inside"} {
		if ino(t, filepath.Join(layer, f)) != ino(t, filepath.Join(rootfs, f)) {
			t.Errorf("layer's %s is not the rootfs's inode", f)
		}
	}
	for _, f := range []string{".wh.del", ".wh.gone"} {
		fi, err := os.Lstat(filepath.Join(layer, f))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0 || fi.Size() != 0 {
			t.Errorf("whiteout %s: %v %v", f, fi, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(layer, "d2")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("d2: %v %v", fi, err)
	}
	if fi, err := os.Lstat(filepath.Join(layer, "chm")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("chm: %v %v", fi, err)
	}
	if fi, err := os.Lstat(filepath.Join(layer, "f2")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o711 {
		t.Errorf("f2: %v %v", fi, err)
	}
	// Unchanged entries and directories stay out.
	for _, f := range []string{"a/keep", "a/file1", "x", "bin", "hl1", "link", "fifo", "chm/c", ".wh.d2", ".wh.f2"} {
		if _, err := os.Lstat(filepath.Join(layer, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("unchanged %s is in the layer: %v", f, err)
		}
	}
}

// TestLayerDirLookup: LayerDir finds a flat template's rootfs and a layered
// template's top layer, nothing else; Delete removes the layer dir; an old
// template.json without layers still loads.
func TestLayerDirLookup(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	r := newTestRegistry(t)
	parent, child := registerParentChild(t, ctx, r)
	if d, err := r.LayerDir(ctx, parent.Digest); err != nil || d != parent.RootfsPath {
		t.Fatalf("flat: %s, %v", d, err)
	}
	if d, err := r.LayerDir(ctx, child.Layers[1].Digest); err != nil || d != filepath.Join(r.Dir, "child", layerDir) {
		t.Fatalf("layered: %s, %v", d, err)
	}
	if _, err := r.LayerDir(ctx, child.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a layered template's rootfs is no layer: %v", err)
	}
	if _, err := r.LayerDir(ctx, "sha256:nope"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad digest: %v", err)
	}
	if err := r.Delete(ctx, "child"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(r.Dir, "child")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("child dir left: %v", err)
	}
	if _, err := r.LayerDir(ctx, child.Layers[1].Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}

	// template.json as written before layers existed.
	old := map[string]any{"name": "parent", "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024,
		"createdAt": "2026-11-01T00:00:00Z", "source": "dir:/x", "digest": parent.Digest}
	b, _ := json.Marshal(old)
	if err := os.WriteFile(filepath.Join(r.Dir, "parent", metaFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := r.Get(ctx, "parent")
	if err != nil || !reflect.DeepEqual(got.LayerChain(), []LayerRef{{Digest: parent.Digest}}) || got.TopLayerDir() != got.RootfsPath {
		t.Fatalf("old template.json: %+v, %v", got, err)
	}
}
