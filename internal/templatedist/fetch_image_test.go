package templatedist_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/imagetest"
	"github.com/cube-dev/cube/internal/template"
	"github.com/cube-dev/cube/internal/templatedist"
)

// capNetRaw is a security.capability value (vfs_cap_data revision 2,
// effective) granting cap_net_raw, as `setcap cap_net_raw+ep` writes it.
func capNetRaw() string {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|1) // VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
	binary.LittleEndian.PutUint32(b[4:], 1<<13)        // permitted: CAP_NET_RAW
	return string(b)
}

var imageConfig = v1.Config{
	Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=hello world"},
	WorkingDir: "/srv/app",
	User:       "app",
	Entrypoint: []string{"/bin/ping"},
	Cmd:        []string{"-c", "1", "localhost"},
}

// imageLayer is a layer with owners, setuid, a hard link, a symlink, file
// capabilities and user.* xattrs on a file, a directory and a symlink.
func imageLayer(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h tar.Header, body string) {
		t.Helper()
		h.Format = tar.FormatPAX
		h.Size = int64(len(body))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	x := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m["SCHILYXATTR."+kv[i]] = kv[i+1]
		}
		return m
	}
	dir := func(name string, mode int64) tar.Header {
		return tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}
	}
	add(dir("./", 0o755), "")
	add(dir("etc/", 0o755), "")
	add(tar.Header{Typeflag: tar.TypeReg, Name: "etc/passwd", Mode: 0o644}, "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/srv/app:/bin/sh\n")
	add(tar.Header{Typeflag: tar.TypeReg, Name: "etc/group", Mode: 0o644}, "root:x:0:\napp:x:1001:\n")
	add(dir("bin/", 0o755), "")
	add(tar.Header{Typeflag: tar.TypeReg, Name: "bin/ping", Mode: 0o755, PAXRecords: x("security.capability", capNetRaw())}, "PING")
	add(tar.Header{Typeflag: tar.TypeReg, Name: "bin/su", Mode: 0o4755}, "SU")
	add(tar.Header{Typeflag: tar.TypeLink, Name: "bin/su-link", Linkname: "bin/su"}, "")
	add(tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/pong", Linkname: "ping"}, "")
	srv := dir("srv/app/", 0o750)
	srv.Uid, srv.Gid, srv.PAXRecords = 1001, 1001, x("user.role", "workdir")
	add(srv, "")
	add(tar.Header{Typeflag: tar.TypeReg, Name: "srv/app/data", Mode: 0o640, Uid: 1001, Gid: 1001,
		PAXRecords: x("user.origin", "image", "user.bin", "\x00\x01\xff")}, "app data\n")
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// newImageServer serves template "img" made from an OCI layout of an image
// with imageLayer and imageConfig, so it has defaults and xattrs.
func newImageServer(t *testing.T, wrap func(http.Handler) http.Handler) *server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("template import keeps owners and security.capability: needs root")
	}
	ctx := context.Background()
	img := imagetest.Image(t, imageConfig, imageLayer(t))
	dir := t.TempDir()
	st, key := serverStore(t, dir)
	reg := &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
	tpl, err := reg.ImportImage(ctx, "img", template.ImageSource{Path: imagetest.Layout(t, img)})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Defaults == nil || tpl.Defaults.User != "app" {
		t.Fatalf("server template has defaults %+v", tpl.Defaults)
	}
	var h http.Handler = templatedist.Handler(reg, st)
	if wrap != nil {
		h = wrap(h)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return &server{reg: reg, tpl: tpl, key: key, keys: st, url: hs.URL, srv: hs}
}

// treeOf describes every entry under root: type, mode, owner, size and
// content hash, link target, mtime, xattrs, and for multiply-linked files
// the first path of the inode.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	inodes := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("mode=%o uid=%d gid=%d mtime=%d", st.Mode, st.Uid, st.Gid, fi.ModTime().UnixNano())
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			desc += " sha256=" + hex.EncodeToString(sum[:8])
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					desc += " linkof=" + first
				} else {
					inodes[st.Ino] = rel
				}
				desc += fmt.Sprintf(" nlink=%d", st.Nlink)
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		desc += " xattrs=" + xattrsOf(t, p)
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func xattrsOf(t *testing.T, p string) string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("llistxattr %s: %v", p, err)
	}
	var names []string
	for _, s := range strings.Split(string(buf[:n]), "\x00") {
		if s != "" {
			names = append(names, s)
		}
	}
	sort.Strings(names)
	var parts []string
	for _, name := range names {
		v := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(p, name, v)
		if err != nil {
			t.Fatalf("lgetxattr %s %s: %v", p, name, err)
		}
		parts = append(parts, fmt.Sprintf("%s=%q", name, v[:m]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// sameTemplate compares what a node registered with the server's template:
// metadata but the node's own Source/CreatedAt, and the whole tree.
func sameTemplate(t *testing.T, got, want template.Template) {
	t.Helper()
	if got.Digest != want.Digest || got.CPUCount != want.CPUCount || got.MemoryMB != want.MemoryMB ||
		got.DiskSizeMB != want.DiskSizeMB || !reflect.DeepEqual(got.Defaults, want.Defaults) {
		t.Errorf("metadata differs:\nnode   %+v defaults %+v\nserver %+v defaults %+v", got, got.Defaults, want, want.Defaults)
	}
	a, b := treeOf(t, got.RootfsPath), treeOf(t, want.RootfsPath)
	for p, w := range b {
		if a[p] != w {
			t.Errorf("%s:\nnode   %s\nserver %s", p, a[p], w)
		}
	}
	for p := range a {
		if _, ok := b[p]; !ok {
			t.Errorf("%s only on the node: %s", p, a[p])
		}
	}
}

// TestFetchImageTemplateIdentical: an image template (defaults, file
// capabilities, user.* xattrs, setuid, hard link, owners) fetched by a node
// is identical to the server's, metadata and tree, and survives the node's
// registry being reopened.
func TestFetchImageTemplateIdentical(t *testing.T) {
	s := newImageServer(t, nil)
	want := s.tpl
	if tree := treeOf(t, want.RootfsPath); !strings.Contains(tree["bin/ping"], "security.capability") ||
		!strings.Contains(tree["srv/app/data"], "user.origin") {
		t.Fatalf("the server's template lacks the xattrs the test needs: %q %q", tree["bin/ping"], tree["srv/app/data"])
	}
	node := nodeRegistry(t)
	f := &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
	got, err := f.Fetch(testCtx(t), node, "img")
	if err != nil {
		t.Fatal(err)
	}
	sameTemplate(t, got, want)
	reopened, err := (&template.Registry{Dir: node.Dir}).Get(context.Background(), "img")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(reopened.Defaults, want.Defaults) || reopened.Defaults.Workdir != "/srv/app" ||
		reopened.Defaults.Env["GREETING"] != "hello world" || !reflect.DeepEqual(reopened.Defaults.Cmd, imageConfig.Cmd) {
		t.Fatalf("defaults in the node's template.json: %+v, server's %+v", reopened.Defaults, want.Defaults)
	}
}

// TestFetchMetadataCompat: the metadata is a superset of the old
// {name, digest, sizes} document (an older node decodes it as before), and
// templates without defaults or xattrs publish exactly the old fields.
func TestFetchMetadataCompat(t *testing.T) {
	s := newImageServer(t, nil)
	res := get(t, s.url+"/templates/img", map[string]string{"X-API-Key": s.key})
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	var old cluster.TemplateRef
	if err := json.Unmarshal(body, &old); err != nil || old.Digest != s.tpl.Digest || old.Name != "img" {
		t.Fatalf("old decoder: %+v %v", old, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m["defaults"] == nil || m["xattrDigest"] == nil {
		t.Fatalf("image template metadata %s", body)
	}
	plain := newServer(t, nil)
	res = get(t, plain.url+"/templates/tiny", map[string]string{"X-API-Key": plain.key})
	m = nil
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := []string{"cpuCount", "digest", "diskSizeMB", "memoryMB", "name"}; !reflect.DeepEqual(keys, want) {
		t.Fatalf("plain template metadata has %q, want %q", keys, want)
	}
}

// rewriteTar passes a tar stream through edit, entry by entry.
func rewriteTar(b []byte, edit func(h *tar.Header)) ([]byte, error) {
	tr := tar.NewReader(bytes.NewReader(b))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		edit(h)
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, err
		}
	}
	err := tw.Close()
	return out.Bytes(), err
}

// dropXattrs removes the SCHILYXATTR records, as a server of the previous
// version wrote none.
func dropXattrs(h *tar.Header) {
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "SCHILYXATTR.") {
			delete(h.PAXRecords, k)
		}
	}
}

// oldServer makes the server answer as the previous version did: metadata
// without defaults and xattrDigest, a stream without xattrs.
func oldServer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		if strings.HasSuffix(r.URL.Path, "/rootfs.tar") {
			b, err := rewriteTar(rec.Body.Bytes(), dropXattrs)
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			w.Write(b)
			return
		}
		// The metadata of that version: these fields only.
		var meta map[string]json.RawMessage
		if err := json.Unmarshal(rec.Body.Bytes(), &meta); err != nil {
			w.Write(rec.Body.Bytes())
			return
		}
		for k := range meta {
			switch k {
			case "name", "digest", "cpuCount", "memoryMB", "diskSizeMB":
			default:
				delete(meta, k)
			}
		}
		json.NewEncoder(w).Encode(meta)
	})
}

// TestFetchFromOldServer: a node fetching from a server of the previous
// version (no defaults, no xattrs) registers the template without them, its
// digest still verified.
func TestFetchFromOldServer(t *testing.T) {
	s := newImageServer(t, oldServer)
	node := nodeRegistry(t)
	f := &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
	got, err := f.Fetch(testCtx(t), node, "img")
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != s.tpl.Digest || got.Defaults != nil {
		t.Fatalf("from an old server: digest %s defaults %+v", got.Digest, got.Defaults)
	}
	if x := xattrsOf(t, filepath.Join(got.RootfsPath, "bin/ping")); x != "{}" {
		t.Fatalf("xattrs %s from a stream without any", x)
	}
}

// TestFetchRefusesXattrTampering: xattrs changed in transit, or a node that
// loses some, fail the fetch (xattrs are outside Digest, inside
// xattrDigest); nothing is registered.
func TestFetchRefusesXattrTampering(t *testing.T) {
	retar := func(edit func(*tar.Header)) func(http.Handler) http.Handler {
		return tamper("/rootfs.tar", func(b []byte, w http.ResponseWriter) {
			out, err := rewriteTar(b, edit)
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			w.Write(out)
		})
	}
	cases := []struct {
		name string
		wrap func(http.Handler) http.Handler
		kind error
	}{
		{"capability added", retar(func(h *tar.Header) {
			if h.Name == "./bin/su" {
				h.Format = tar.FormatPAX
				h.PAXRecords = map[string]string{"SCHILYXATTR.security.capability": capNetRaw()}
			}
		}), errdefs.ErrConflict},
		{"value changed", retar(func(h *tar.Header) {
			if _, ok := h.PAXRecords["SCHILYXATTR.user.origin"]; ok {
				h.PAXRecords["SCHILYXATTR.user.origin"] = "elsewhere"
			}
		}), errdefs.ErrConflict},
		{"xattrs dropped", retar(dropXattrs), errdefs.ErrConflict},
		{"malformed xattr digest", tamper("/templates/img", func(b []byte, w http.ResponseWriter) {
			w.Write(bytes.Replace(b, []byte(`"xattrDigest":"sha256:`), []byte(`"xattrDigest":"md5:`), 1))
		}), errdefs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newImageServer(t, c.wrap)
			node := nodeRegistry(t)
			f := &templatedist.Fetcher{BaseURLs: []string{s.url}, APIKey: s.key}
			_, err := f.Fetch(testCtx(t), node, "img")
			t.Logf("refused: %v", err)
			if !errors.Is(err, c.kind) {
				t.Fatalf("err %v, want %v", err, c.kind)
			}
			assertNothingRegistered(t, node)
		})
	}
}
