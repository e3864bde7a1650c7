package files

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestSignature(t *testing.T) {
	// Known answer: "v1_" + unpadded base64(sha256("/a:read::tok")).
	got := Sign("/a", OpRead, "", "tok", 0)
	if !strings.HasPrefix(got, "v1_") || strings.HasSuffix(got, "=") || len(got) != 3+43 {
		t.Fatalf("Sign = %q", got)
	}
	now := time.Unix(1_000_000, 0)
	q := url.Values{"path": {"/a"}, "signature": {got}}
	if err := VerifySignature(q, OpRead, "tok", now); err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		name string
		q    url.Values
		op   string
		tok  string
	}{
		{"wrong op", q, OpWrite, "tok"},
		{"wrong token", q, OpRead, "other"},
		{"no token configured", q, OpRead, ""},
		{"no signature", url.Values{"path": {"/a"}}, OpRead, "tok"},
		{"other user", url.Values{"path": {"/a"}, "username": {"root"}, "signature": {got}}, OpRead, "tok"},
		{"expired", url.Values{"path": {"/a"}, "signature": {Sign("/a", OpRead, "", "tok", 999_999)}, "signature_expiration": {"999999"}}, OpRead, "tok"},
		{"bad expiration", url.Values{"path": {"/a"}, "signature": {got}, "signature_expiration": {"soon"}}, OpRead, "tok"},
		{"expiration not signed", url.Values{"path": {"/a"}, "signature": {got}, "signature_expiration": {"2000000"}}, OpRead, "tok"},
	}
	for _, c := range bad {
		if err := VerifySignature(c.q, c.op, c.tok, now); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	fresh := url.Values{"path": {"/a"}, "signature": {Sign("/a", OpRead, "", "tok", 2_000_000)}, "signature_expiration": {"2000000"}}
	if err := VerifySignature(fresh, OpRead, "tok", now); err != nil {
		t.Errorf("unexpired: %v", err)
	}
}

// memSink records uploads instead of writing them.
type memSink struct {
	files map[string][]byte
	order []string
}

func (m *memSink) store(p string, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if m.files == nil {
		m.files = map[string][]byte{}
	}
	m.files[p] = b
	m.order = append(m.order, p)
	return nil
}

func request(ct, enc string, body []byte) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "/files", bytes.NewReader(body))
	r.Header.Set("Content-Type", ct)
	if enc != "" {
		r.Header.Set("Content-Encoding", enc)
	}
	return r
}

func TestReadUploadMultipartKeepsFullPath(t *testing.T) {
	body := "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/abs/dir/a.txt\"\r\n\r\nA\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nignored\r\n" +
		"--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rel/b.txt\"\r\n\r\nBB\r\n--B--\r\n"
	var m memSink
	paths, err := readUpload(request("multipart/form-data; boundary=B", "", []byte(body)), "/home/u", "", m.store)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(paths, ",") != "/abs/dir/a.txt,/home/u/rel/b.txt" || string(m.files["/home/u/rel/b.txt"]) != "BB" {
		t.Fatalf("paths %v files %q", paths, m.files)
	}
	// The path query overrides the filename.
	m = memSink{}
	body = "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"ignored\"\r\n\r\nA\r\n--B--\r\n"
	paths, err = readUpload(request("multipart/form-data; boundary=B", "", []byte(body)), "/home/u", "~/q", m.store)
	if err != nil || len(paths) != 1 || paths[0] != "/home/u/q" {
		t.Fatalf("paths %v err %v", paths, err)
	}
}

func FuzzReadUpload(f *testing.F) {
	f.Add("multipart/form-data; boundary=B", "", "",
		[]byte("--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nx\r\n--B--\r\n"))
	f.Add("application/octet-stream", "gzip", "/p", []byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, ct, enc, pathQuery string, body []byte) {
		var m memSink
		paths, err := readUpload(request(ct, enc, body), "/home/u", pathQuery, m.store)
		if err != nil {
			if errdefs.HTTPStatus(err) >= 500 && !errors.Is(err, errUnsupportedEncoding) {
				t.Fatalf("server-side error for client input: %v", err)
			}
			return
		}
		if len(paths) == 0 {
			t.Fatal("success without files")
		}
		seen := map[string]bool{}
		for _, p := range paths {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.ContainsRune(p, 0) {
				t.Fatalf("bad target path %q", p)
			}
			if seen[p] {
				t.Fatalf("duplicate target %q", p)
			}
			seen[p] = true
		}
	})
}
