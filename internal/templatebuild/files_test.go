package templatebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/store"
)

type entry struct {
	name, body, link string
	typ              byte
}

func makeTar(t *testing.T, gz bool, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Linkname: e.link, Uid: 65534, Gid: 65534}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func listTar(t *testing.T, b []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		s := h.Name
		if h.Linkname != "" {
			s += "->" + h.Linkname
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s keeps owner %d:%d", h.Name, h.Uid, h.Gid)
		}
		out = append(out, s)
	}
}

// The captured node-tar quirk (a symlinked dir followed by entries
// "through" it), `..`, absolute names and devices are dropped; gzip is
// detected by its magic bytes.
func TestSanitizeTar(t *testing.T) {
	for _, gz := range []bool{false, true} {
		in := makeTar(t, gz,
			entry{name: "app/", typ: tar.TypeDir},
			entry{name: "app/main.py", typ: tar.TypeReg, body: "print(1)\n"},
			entry{name: "links/appl", typ: tar.TypeSymlink, link: "../app"},
			entry{name: "links/appl/main.py", typ: tar.TypeReg, body: "through the link"},
			entry{name: "links/abs", typ: tar.TypeSymlink, link: "/etc"},
			entry{name: "links/abs/passwd", typ: tar.TypeReg, body: "root::0:0"},
			entry{name: "../evil", typ: tar.TypeReg, body: "x"},
			entry{name: "a/../../evil2", typ: tar.TypeReg, body: "x"},
			entry{name: "/etc/shadow", typ: tar.TypeReg, body: "x"},
			entry{name: "dev", typ: tar.TypeChar},
			entry{name: "hard", typ: tar.TypeLink, link: "app/main.py"},
			entry{name: "hard-out", typ: tar.TypeLink, link: "../outside"},
			entry{name: "./app/./sub/x.json", typ: tar.TypeReg, body: "{}"},
		)
		var out bytes.Buffer
		if err := sanitizeTar(bytes.NewReader(in), &out); err != nil {
			t.Fatal(err)
		}
		got := strings.Join(listTar(t, out.Bytes()), " ")
		want := "app/ app/main.py links/appl->../app links/abs->/etc hard->app/main.py app/sub/x.json"
		if got != want {
			t.Errorf("gzip=%v:\n got %s\nwant %s", gz, got, want)
		}
	}
	if err := sanitizeTar(strings.NewReader("not a tar at all, but long enough to be read as a header block"), io.Discard); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("garbage: %v", err)
	}
}

func TestUploadToken(t *testing.T) {
	secret := []byte("s3cret")
	hash := strings.Repeat("ab", 32)
	now := time.Unix(1_800_000_000, 0)
	exp := now.Add(time.Hour).Unix()
	tok := uploadToken(secret, hash, exp)
	ok := func(hash, tok, exp string, at time.Time) error { return verifyUploadToken(secret, hash, tok, exp, at) }
	expS := itoa(exp)
	if err := ok(hash, tok, expS, now); err != nil {
		t.Fatalf("valid token: %v", err)
	}
	if err := ok(hash, tok, expS, now.Add(2*time.Hour)); !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired: %v", err)
	}
	if err := ok(strings.Repeat("cd", 32), tok, expS, now); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("other hash: %v", err)
	}
	if err := ok(hash, tok, itoa(exp+3600), now); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("extended expiry: %v", err)
	}
	if err := verifyUploadToken([]byte("other"), hash, tok, expS, now); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("other secret: %v", err)
	}
	if err := ok(hash, "", expS, now); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("no token: %v", err)
	}
	if err := ok(hash, tok, "soon", now); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("bad expires: %v", err)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// Stored archives: plain and gzip tars are accepted, anything else and
// oversize bodies refused with nothing left behind; concurrent identical
// uploads all succeed and one is kept; what an earlier version kept on
// disk moves into the store.
func TestFileStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	spool := filepath.Join(dir, "template-files")
	fs := fileStore{st: st, dir: spool, maxBytes: 4096}
	has := func(h string) bool {
		t.Helper()
		ok, err := fs.used(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	hash := strings.Repeat("0", 64)
	if has(hash) {
		t.Fatal("empty store has the hash")
	}
	plain := makeTar(t, false, entry{name: "hello.txt", typ: tar.TypeReg, body: "hello world\n"})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- fs.put(ctx, hash, bytes.NewReader(plain)) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !has(hash) {
		t.Fatal("stored hash is not present")
	}
	r, err := fs.open(ctx, hash)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, plain) {
		t.Fatal("stored archive differs from the upload")
	}
	gz := strings.Repeat("1", 64)
	if err := fs.put(ctx, gz, bytes.NewReader(makeTar(t, true, entry{name: "a", typ: tar.TypeReg, body: "a"}))); err != nil || !has(gz) {
		t.Fatalf("gzip upload: %v", err)
	}
	bad := strings.Repeat("2", 64)
	if err := fs.put(ctx, bad, strings.NewReader(strings.Repeat("x", 1024))); !errors.Is(err, errdefs.ErrInvalidArgument) || has(bad) {
		t.Fatalf("garbage upload: %v", err)
	}
	if err := fs.put(ctx, bad, bytes.NewReader(make([]byte, 5000))); !errors.Is(err, ErrTooLarge) || has(bad) {
		t.Fatalf("oversize upload: %v", err)
	}
	if err := fs.put(ctx, "../x", bytes.NewReader(plain)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad hash: %v", err)
	}
	// A second upload of a stored hash is read and dropped: the first stays.
	if err := fs.put(ctx, hash, strings.NewReader("not even a tar")); err != nil {
		t.Fatalf("second upload of a stored hash: %v", err)
	}
	if entries, _ := os.ReadDir(spool); len(entries) != 0 {
		t.Fatalf("spool dir holds %v; want nothing", entries)
	}
	if _, err := fs.open(ctx, strings.Repeat("3", 64)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("open of a missing hash: %v", err)
	}

	// An earlier version's uploads and a killed upload's spool file.
	legacy := strings.Repeat("4", 64)
	if err := os.WriteFile(filepath.Join(spool, legacy), plain, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spool, ".tmp-"+legacy+"-1"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spool, "README"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fs.importLocal(ctx); err != nil {
		t.Fatal(err)
	}
	if !has(legacy) {
		t.Fatal("legacy upload not imported")
	}
	if entries, _ := os.ReadDir(spool); len(entries) != 1 || entries[0].Name() != "README" {
		t.Fatalf("spool dir after import holds %v; want README only", entries)
	}
}
