package ocilayer

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

var mtime = time.Unix(1700000000, 0)

type ent struct {
	hdr  tar.Header
	body string
}

func file(name, body string, mode int64) ent {
	return ent{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: mtime}, body}
}

func dir(name string, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: mtime}}
}

func sym(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: mtime}}
}

func hard(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: mtime}}
}

func wh(name string) ent { return file(name, "", 0o644) }

func tarOf(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Format == tar.FormatUnknown && len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// describe renders root as "path: kind mode [content|-> target]" lines.
func describe(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		perm := fmt.Sprintf("%04o", uint32(fi.Mode().Perm())|setBits(fi.Mode()))
		switch {
		case fi.IsDir():
			out[rel] = "dir " + perm
		case fi.Mode()&fs.ModeSymlink != 0:
			tgt, _ := os.Readlink(p)
			out[rel] = "sym -> " + tgt
		case fi.Mode()&fs.ModeNamedPipe != 0:
			out[rel] = "fifo " + perm
		default:
			b, _ := os.ReadFile(p)
			out[rel] = "file " + perm + " " + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func setBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

func applyAll(t *testing.T, root string, layers ...[]ent) error {
	t.Helper()
	for i, l := range layers {
		if _, err := Apply(context.Background(), root, bytes.NewReader(tarOf(t, l...)), Options{IgnoreOwners: os.Geteuid() != 0}); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

func TestApply(t *testing.T) {
	tests := []struct {
		name   string
		layers [][]ent
		want   map[string]string // exact tree
	}{
		{
			name: "modes incl setuid setgid sticky",
			layers: [][]ent{{
				dir("bin", 0o755), file("bin/su", "su", 0o4755), dir("srv", 0o2775), dir("tmp", 0o1777),
				file("etc/motd", "hi", 0o640), sym("bin/sh", "/bin/busybox"),
			}},
			want: map[string]string{
				"bin": "dir 0755", "bin/su": "file 4755 su", "bin/sh": "sym -> /bin/busybox", "srv": "dir 2775",
				"tmp": "dir 1777", "etc": "dir 0755", "etc/motd": "file 0640 hi",
			},
		},
		{
			name: "whiteout removes lower file and directory tree",
			layers: [][]ent{
				{file("a/keep", "k", 0o644), file("a/gone", "g", 0o644), file("d/sub/x", "x", 0o644)},
				{wh("a/.wh.gone"), wh(".wh.d")},
			},
			want: map[string]string{"a": "dir 0755", "a/keep": "file 0644 k"},
		},
		{
			name: "whiteout does not hide its own layer",
			layers: [][]ent{
				{file("f", "lower", 0o644)},
				{file("f", "upper", 0o644), wh(".wh.f")},
			},
			want: map[string]string{"f": "file 0644 upper"},
		},
		{
			name:   "whiteout of a missing path is a no-op",
			layers: [][]ent{{wh("nowhere/.wh.x"), wh(".wh.y"), file("z", "z", 0o600)}},
			want:   map[string]string{"z": "file 0600 z"},
		},
		{
			name: "opaque directory hides lower contents, keeps its own",
			layers: [][]ent{
				{file("o/old", "1", 0o644), file("o/sub/deep", "2", 0o644), file("o/sub/keep", "3", 0o644), file("other", "4", 0o644)},
				{dir("o", 0o750), file("o/new", "n", 0o644), wh("o/.wh..wh..opq"), file("o/sub/keep", "3b", 0o644)},
			},
			want: map[string]string{
				"o": "dir 0750", "o/new": "file 0644 n", "o/sub": "dir 0755", "o/sub/keep": "file 0644 3b", "other": "file 0644 4",
			},
		},
		{
			name: "file replaces directory, directory replaces file, symlink replaces directory",
			layers: [][]ent{
				{file("x/inner", "i", 0o644), file("y", "y", 0o644), file("z/inner", "i", 0o644)},
				{file("x", "now a file", 0o600), dir("y", 0o700), file("y/child", "c", 0o644), sym("z", "x")},
			},
			want: map[string]string{"x": "file 0600 now a file", "y": "dir 0700", "y/child": "file 0644 c", "z": "sym -> x"},
		},
		{
			name: "later entry replaces symlink without writing through it",
			layers: [][]ent{
				{file("target", "t", 0o644), sym("s", "target")},
				{file("s", "s", 0o644)},
			},
			want: map[string]string{"target": "file 0644 t", "s": "file 0644 s"},
		},
		{
			name: "paths through a symlinked directory resolve inside the root",
			layers: [][]ent{
				{dir("usr/lib", 0o755), sym("lib", "/usr/lib"), sym("rel", "../../usr/lib")},
				{file("lib/a.so", "a", 0o644), file("rel/b.so", "b", 0o644)},
			},
			want: map[string]string{
				"usr": "dir 0755", "usr/lib": "dir 0755", "usr/lib/a.so": "file 0644 a", "usr/lib/b.so": "file 0644 b",
				"lib": "sym -> /usr/lib", "rel": "sym -> ../../usr/lib",
			},
		},
		{
			name:   "fifo kept, device nodes skipped",
			layers: [][]ent{{{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "p", Mode: 0o620}}, {hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}}}},
			want:   map[string]string{"p": "fifo 0620"},
		},
		{
			name:   "root entry and ./ prefixes",
			layers: [][]ent{{dir(".", 0o755), file("./a", "a", 0o644), file("/b", "b", 0o644)}},
			want:   map[string]string{"a": "file 0644 a", "b": "file 0644 b"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := applyAll(t, root, tc.layers...); err != nil {
				t.Fatal(err)
			}
			got := describe(t, root)
			if fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(tc.want)) {
				t.Errorf("tree:\n got %v\nwant %v", sorted(got), sorted(tc.want))
			}
		})
	}
}

func sorted(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+": "+v)
	}
	sort.Strings(out)
	return out
}

func TestApplyHardLinks(t *testing.T) {
	root := t.TempDir()
	err := applyAll(t, root,
		[]ent{file("bin/busybox", "bb", 0o4755)},
		[]ent{hard("bin/ls", "bin/busybox"), file("usr/f", "f", 0o644), hard("/usr/g", "/usr/f")},
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, pair := range [][2]string{{"bin/ls", "bin/busybox"}, {"usr/g", "usr/f"}} {
		var a, b unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, pair[0]), &a); err != nil {
			t.Fatal(err)
		}
		if err := unix.Lstat(filepath.Join(root, pair[1]), &b); err != nil {
			t.Fatal(err)
		}
		if a.Ino != b.Ino || a.Nlink != 2 {
			t.Errorf("%s: ino %d nlink %d, want ino %d nlink 2", pair[0], a.Ino, a.Nlink, b.Ino)
		}
	}
	if fi, _ := os.Stat(filepath.Join(root, "bin/ls")); fi.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("bin/ls lost setuid: %v", fi.Mode())
	}
}

func TestApplyTimes(t *testing.T) {
	root := t.TempDir()
	if err := applyAll(t, root, []ent{dir("d", 0o755), file("d/f", "x", 0o644), sym("d/s", "f")}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/f", "d/s"} {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(mtime) {
			t.Errorf("%s mtime %v, want %v", p, fi.ModTime(), mtime)
		}
	}
}

// TestApplyRefusesEscapes: hostile layers never create, change or remove
// anything outside the root.
func TestApplyRefusesEscapes(t *testing.T) {
	tests := []struct {
		name    string
		layers  [][]ent
		wantErr bool // else: applied, but confined to the root
	}{
		{"dotdot file", [][]ent{{file("../evil", "x", 0o644)}}, true},
		{"dotdot inside path", [][]ent{{file("a/../../evil", "x", 0o644)}}, true},
		{"dotdot hard link target", [][]ent{{hard("l", "../outside/victim")}}, true},
		{"hard link to missing absolute path", [][]ent{{hard("l", "/outside/victim")}}, true},
		{"dotdot whiteout", [][]ent{{wh("../outside/.wh.victim")}}, true},
		{"absolute symlink then write through it", [][]ent{{sym("esc", "OUTSIDE")}, {file("esc/victim", "pwned", 0o644)}}, true},
		{"relative symlink then write through it", [][]ent{{sym("up", "../../../../../../OUTSIDE")}, {file("up/new", "pwned", 0o644)}}, true},
		{"symlink to / then write through it", [][]ent{{sym("esc", "/")}, {file("esc/victim", "confined", 0o644)}}, false},
		{"symlink to ../.. then write through it", [][]ent{{sym("up", "../../..")}, {file("up/victim", "confined", 0o644)}}, false},
		{"symlink then whiteout through it", [][]ent{{sym("esc", "OUTSIDE")}, {wh("esc/.wh.victim")}}, false},
		{"symlink to .. then whiteout through it", [][]ent{{sym("up", "..")}, {wh("up/outside/.wh.victim")}}, false},
		{"symlink then opaque through it", [][]ent{{sym("esc", "OUTSIDE")}, {wh("esc/.wh..wh..opq")}}, true},
		{"symlink to .. then opaque through it", [][]ent{{sym("up", "..")}, {wh("up/.wh..wh..opq")}}, false},
		{"symlink then hard link through it", [][]ent{{sym("esc", "OUTSIDE")}, {hard("stolen", "esc/victim")}}, true},
		{"symlink replaced by file", [][]ent{{sym("s", "OUTSIDE/victim")}, {file("s", "pwned", 0o644)}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			root := filepath.Join(base, "root")
			for _, d := range []string{outside, root} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("safe"), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, l := range tc.layers {
				for i := range l {
					l[i].hdr.Linkname = strings.ReplaceAll(l[i].hdr.Linkname, "OUTSIDE", outside)
				}
			}
			err := applyAll(t, root, tc.layers...)
			if tc.wantErr && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("err = %v, want ErrInvalidArgument", err)
			}
			if !tc.wantErr && err != nil {
				t.Errorf("err = %v, want confined success", err)
			}
			got := describe(t, outside)
			if want := map[string]string{"victim": "file 0644 safe"}; fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(want)) {
				t.Errorf("outside changed: %v", sorted(got))
			}
			if entries, _ := os.ReadDir(base); len(entries) != 2 {
				t.Errorf("base dir has %d entries, want root and outside only", len(entries))
			}
		})
	}
}

func TestApplyCorruptTar(t *testing.T) {
	good := tarOf(t, file("a", strings.Repeat("x", 4096), 0o644), file("b", "b", 0o644))
	cases := map[string][]byte{
		"truncated": good[:1000],
		"garbage":   bytes.Repeat([]byte("not a tar "), 100),
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Apply(context.Background(), t.TempDir(), bytes.NewReader(data), Options{})
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func TestApplyCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Apply(ctx, t.TempDir(), bytes.NewReader(tarOf(t, file("a", "a", 0o644))), Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestApplyOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown to arbitrary uids")
	}
	root := t.TempDir()
	f := file("bin/tool", "t", 0o4755)
	f.hdr.Uid, f.hdr.Gid = 1234, 5678
	d := dir("home/app", 0o2750)
	d.hdr.Uid, d.hdr.Gid = 1000, 1000
	s := sym("home/app/link", "/bin/tool")
	s.hdr.Uid, s.hdr.Gid = 42, 43
	if err := applyAll(t, root, []ent{f, d, s}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string][3]uint32{"bin/tool": {1234, 5678, 0o4755}, "home/app": {1000, 1000, 0o2750}, "home/app/link": {42, 43, 0o777}} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != want[0] || st.Gid != want[1] || st.Mode&0o7777 != want[2] {
			t.Errorf("%s: %d:%d %04o, want %d:%d %04o", p, st.Uid, st.Gid, st.Mode&0o7777, want[0], want[1], want[2])
		}
	}
}

func TestApplyXattrs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: trusted.* and security.* xattrs")
	}
	root := t.TempDir()
	f := file("bin/ping", "p", 0o755)
	caps := "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" // cap_net_raw+ep
	f.hdr.PAXRecords = map[string]string{"SCHILYXATTR.user.cube": "yes", "SCHILYXATTR.security.capability": caps}
	d := dir("data", 0o755)
	d.hdr.PAXRecords = map[string]string{"SCHILYXATTR.trusted.cube": "dir"}
	if err := applyAll(t, root, []ent{f, d}); err != nil {
		if errors.Is(err, syscall.ENOTSUP) {
			t.Skip("filesystem without xattrs")
		}
		t.Fatal(err)
	}
	for p, kv := range map[string][2]string{"bin/ping": {"user.cube", "yes"}, "data": {"trusted.cube", "dir"}} {
		buf := make([]byte, 64)
		n, err := unix.Lgetxattr(filepath.Join(root, p), kv[0], buf)
		if err != nil || string(buf[:n]) != kv[1] {
			t.Errorf("%s %s = %q, %v; want %q", p, kv[0], buf[:max(n, 0)], err, kv[1])
		}
	}
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(filepath.Join(root, "bin/ping"), "security.capability", buf)
	if err != nil || string(buf[:n]) != caps {
		t.Errorf("security.capability = %x, %v", buf[:max(n, 0)], err)
	}
}
