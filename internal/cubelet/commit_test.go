package cubelet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/rootfstest"
	"github.com/cube-dev/cube/internal/template"
)

// commitParent registers the parent template "parent": busybox plus files
// the build changes, one carrying a user.* xattr.
func commitParent(ctx context.Context, t *testing.T, n *node) template.Template {
	t.Helper()
	bb := rootfstest.Busybox(t)
	files := map[string]string{
		"data/gone.txt": "gone\n", "data/keep.txt": "keep\n", "data/mod.txt": "old\n",
		"data/olddir/a": "a\n", "data/olddir/b": "b\n", "data/same.txt": "same\n",
	}
	tm, err := n.templates.Register(ctx, "parent", template.Meta{Source: "test",
		Defaults: &template.Defaults{Env: map[string]string{"FROM": "parent", "KEEP": "1"}, Workdir: "/data"}},
		func(ctx context.Context, rootfs string) error {
			if err := template.LinkTree(ctx, bb, rootfs); err != nil {
				return err
			}
			for p, data := range files {
				if err := os.MkdirAll(filepath.Join(rootfs, filepath.Dir(p)), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(rootfs, p), []byte(data), 0o644); err != nil {
					return err
				}
			}
			return unix.Setxattr(filepath.Join(rootfs, "data/keep.txt"), "user.keep", []byte("lower"), 0)
		})
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// The build: every kind of change a layer can hold.
const commitBuild = `set -e
bb=/bin/busybox
$bb mkdir -p /srv
echo new > /srv/new.txt; $bb chown 1000:1000 /srv/new.txt; $bb chmod 640 /srv/new.txt
echo rootfile > /srv/root.txt
echo more >> /data/mod.txt
$bb rm /data/gone.txt
$bb rm -r /data/olddir; $bb mkdir /data/olddir; echo c > /data/olddir/c
$bb chmod 600 /data/keep.txt; $bb chown 1000:1000 /data/keep.txt
$bb ln -s /data/keep.txt /data/link
$bb cp /bin/busybox /data/suid; $bb chmod 4755 /data/suid
`

// What a sandbox of the committed template must see.
const commitCheck = `bb=/bin/busybox
$bb stat -c '%n %a %u:%g' /srv/new.txt /srv/root.txt /data/keep.txt /data/suid
cat /srv/new.txt /data/mod.txt /data/keep.txt
$bb ls /data/olddir; $bb readlink /data/link
$bb test -e /data/gone.txt && echo gone.txt still there
echo "$FROM $KEEP $ADDED"; $bb pwd
`

const commitWant = `/srv/new.txt 640 1000:1000
/srv/root.txt 644 0:0
/data/keep.txt 600 1000:1000
/data/suid 4755 0:0
new
old
more
keep
c
/data/keep.txt
commit 1 yes
/data/olddir
`

// TestCommitSandbox commits a WritableOnHost sandbox changed from inside
// (with and without a user namespace) and checks the new template, the
// parent left alone, and the committed sandbox still running.
func TestCommitSandbox(t *testing.T) {
	for _, mode := range []nsrt.UserNSMode{nsrt.UserNSOff, nsrt.UserNSOn} {
		t.Run(string(mode), func(t *testing.T) { testCommitSandbox(t, mode) })
	}
}

func testCommitSandbox(t *testing.T, mode nsrt.UserNSMode) {
	n := newTestNode(t)
	n.cfg.PoolSize, n.cfg.UserNS = 0, mode
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	parent := commitParent(ctx, t, n)
	c := n.start(t)

	req := createReq("build1")
	req.Template, req.WritableOnHost = "parent", true
	if _, err := c.CreateSandbox(ctx, req); err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(context.WithoutCancel(ctx), "build1")
	rec, _ := c.store.Get("build1")
	if rec.DiskSizeMB != 0 {
		t.Fatalf("build sandbox has a disk of %d MB", rec.DiskSizeMB)
	}
	if on := usernsOn(ctx, t, c, "build1"); on != (mode == nsrt.UserNSOn) {
		t.Fatalf("user namespace in use: %v, mode %s", on, mode)
	}
	sandboxRun(ctx, t, c, "build1", "root", commitBuild)

	// The upper dir holds canonical ids, also with a user namespace: the
	// layers are idmapped, so a template made of it needs no shifting.
	upper := filepath.Join(c.sandboxDir(rec.Runtime()), upperDir)
	for p, want := range map[string]uint32{"srv/new.txt": 1000, "srv/root.txt": 0, "data/keep.txt": 1000} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(upper, p), &st); err != nil || st.Uid != want || st.Gid != want {
			t.Errorf("upper %s: uid %d gid %d (%v), want %d", p, st.Uid, st.Gid, err, want)
		}
	}
	// An xattr set on a file the sandbox made (busybox has no setfattr).
	if err := unix.Lsetxattr(filepath.Join(upper, "srv/new.txt"), "user.added", []byte("upper"), 0); err != nil {
		t.Fatal(err)
	}

	parentDigest, err := template.Digest(ctx, parent.RootfsPath)
	if err != nil {
		t.Fatal(err)
	}
	creq := nodeproto.CommitRequest{SandboxID: "build1", Name: "child",
		Defaults: nodeproto.TemplateDefaults{Env: map[string]string{"FROM": "commit", "ADDED": "yes"}, Workdir: "/data/olddir"}}
	tm, err := c.Commit(ctx, creq)
	if err != nil {
		t.Fatal(err)
	}
	if tm.CPUCount != parent.CPUCount || tm.MemoryMB != parent.MemoryMB || tm.DiskSizeMB != parent.DiskSizeMB ||
		!strings.HasPrefix(tm.Source, "commit:build1 of parent") || tm.Defaults == nil || tm.Defaults.Workdir != "/data/olddir" ||
		tm.Defaults.Env["KEEP"] != "1" || tm.Defaults.Env["FROM"] != "commit" {
		t.Fatalf("committed %+v (defaults %+v)", tm, tm.Defaults)
	}
	if d, err := template.Digest(ctx, tm.RootfsPath); err != nil || d != tm.Digest {
		t.Fatalf("digest of the new rootfs %s (%v), recorded %s", d, err, tm.Digest)
	}
	// Layered: the parent's one layer plus the build's (template.Meta.Parent).
	if len(tm.Layers) != 2 || tm.Layers[0].Digest != parent.Digest {
		t.Fatalf("committed layers %+v on parent %s", tm.Layers, parent.Digest)
	}
	if d, err := template.Digest(ctx, tm.TopLayerDir()); err != nil || d != tm.Layers[1].Digest {
		t.Fatalf("top layer digest %s (%v), recorded %+v", d, err, tm.Layers[1])
	}
	if d, err := template.Digest(ctx, parent.RootfsPath); err != nil || d != parentDigest {
		t.Fatalf("parent's digest changed: %s (%v), was %s", d, err, parentDigest)
	}
	for _, p := range []string{"data/keep.txt", "data/mod.txt"} {
		b, _ := os.ReadFile(filepath.Join(parent.RootfsPath, p))
		if strings.Count(string(b), "\n") != 1 || sameInode(t, parent.RootfsPath, tm.RootfsPath, p) {
			t.Errorf("parent's %s: %q, or shared with the child", p, b)
		}
	}
	for _, p := range []string{"bin/busybox", "data/same.txt"} {
		if !sameInode(t, parent.RootfsPath, tm.RootfsPath, p) {
			t.Errorf("unchanged %s is not shared with the parent", p)
		}
	}
	for p, want := range map[string]string{"data/keep.txt": "lower", "srv/new.txt": "upper"} {
		buf := make([]byte, 64)
		if m, err := unix.Lgetxattr(filepath.Join(tm.RootfsPath, p), map[string]string{"data/keep.txt": "user.keep", "srv/new.txt": "user.added"}[p], buf); err != nil || string(buf[:m]) != want {
			t.Errorf("xattr of %s in the new template: %q, %v", p, buf[:max(m, 0)], err)
		}
	}
	for _, p := range []string{".cube/envd.json", "etc/hosts"} { // per sandbox, never in a template
		b, _ := os.ReadFile(filepath.Join(tm.RootfsPath, p))
		if strings.Contains(string(b), "build1") || strings.Contains(string(b), `"tok"`) {
			t.Errorf("the build sandbox's %s reached the template: %q", p, b)
		}
	}

	// The committed sandbox was thawed and goes on.
	if got := sandboxRun(ctx, t, c, "build1", "root", "cat /srv/new.txt; echo after > /srv/after.txt"); got != "new\n" {
		t.Errorf("build sandbox after the commit: %q", got)
	}

	if _, err := c.CreateSandbox(ctx, CreateRequest{SandboxID: "child1", Template: "child", EnvdAccessToken: "tok"}); err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(context.WithoutCancel(ctx), "child1")
	if got := sandboxRun(ctx, t, c, "child1", "root", commitCheck); got != commitWant {
		t.Errorf("sandbox of the committed template:\n got %q\nwant %q", got, commitWant)
	}

	// Refusals.
	plain := createReq("plain1")
	plain.Template = "parent"
	if _, err := c.CreateSandbox(ctx, plain); err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(context.WithoutCancel(ctx), "plain1")
	if c.cfg.NoDiskLimit {
		t.Fatal("test node has no disk limit: every sandbox would be committable")
	}
	if _, err := c.Commit(ctx, nodeproto.CommitRequest{SandboxID: "plain1", Name: "x"}); !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), "WritableOnHost") {
		t.Errorf("commit of a sandbox with a disk: %v", err)
	}
	if _, err := c.Commit(ctx, nodeproto.CommitRequest{SandboxID: "nope", Name: "x"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("commit of an unknown sandbox: %v", err)
	}
	if _, err := c.Commit(ctx, nodeproto.CommitRequest{SandboxID: "build1", Name: "Bad Name"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("commit under a bad name: %v", err)
	}
	if _, err := c.Commit(ctx, nodeproto.CommitRequest{SandboxID: "build1", Name: "child"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("replacing a template a sandbox runs on: %v", err)
	}
	// Replacing a template nobody runs works (a rebuilt cache step).
	if _, err := c.Commit(ctx, nodeproto.CommitRequest{SandboxID: "build1", Name: "child2"}); err != nil {
		t.Fatal(err)
	}
	again, err := c.CommitSandbox(ctx, nodeproto.CommitRequest{SandboxID: "build1", Name: "child2", MemoryMB: 300})
	if err != nil || again.MemoryMB != 300 {
		t.Fatalf("replace: %+v, %v", again, err)
	}
	got, err := n.templates.Get(ctx, "child2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(got.RootfsPath, "srv/after.txt")); err != nil {
		t.Errorf("the replaced template lacks what the sandbox wrote since: %v", err)
	}
}

// usernsOn reports whether the processes of sandbox id run in a user
// namespace (root inside is not root on the host).
func usernsOn(ctx context.Context, t *testing.T, c *Cubelet, id string) bool {
	t.Helper()
	m := sandboxRun(ctx, t, c, id, "root", "cat /proc/self/uid_map")
	return strings.Join(strings.Fields(m), " ") != "0 0 4294967295"
}

func sameInode(t *testing.T, a, b, p string) bool {
	t.Helper()
	var sa, sb syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(a, p), &sa); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Lstat(filepath.Join(b, p), &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// TestMergeDefaults: a commit's defaults go onto the parent's: env
// overlaid, the rest replaced when set, the parent's left alone.
func TestMergeDefaults(t *testing.T) {
	parent := &template.Defaults{Env: map[string]string{"A": "1", "B": "2"}, Workdir: "/w", User: "app",
		Entrypoint: []string{"/init"}, StartCmd: "old"}
	got := mergeDefaults(parent, nodeproto.TemplateDefaults{Env: map[string]string{"B": "3", "C": "4"}, User: "root",
		StartCmd: "serve", ReadyCmd: "check"})
	want := &template.Defaults{Env: map[string]string{"A": "1", "B": "3", "C": "4"}, Workdir: "/w", User: "root",
		Entrypoint: []string{"/init"}, StartCmd: "serve", ReadyCmd: "check"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merged %+v, want %+v", got, want)
	}
	if parent.Env["B"] != "2" || parent.User != "app" {
		t.Errorf("parent changed: %+v", parent)
	}
	if got := mergeDefaults(nil, nodeproto.TemplateDefaults{}); got != nil {
		t.Errorf("nothing on nothing: %+v", got)
	}
	if got := mergeDefaults(nil, nodeproto.TemplateDefaults{Workdir: "/x"}); got == nil || got.Workdir != "/x" {
		t.Errorf("onto no defaults: %+v", got)
	}
}
