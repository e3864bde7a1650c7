package envd_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cube-dev/cube/internal/envd"
)

type uploaded struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// multipartBody builds a multipart body with one "file" part per name.
func multipartBody(t *testing.T, files map[string][]byte, order []string) (string, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, name := range order {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, name))
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(files[name])
	}
	mw.Close()
	return mw.FormDataContentType(), &buf
}

func (e *env) upload(t *testing.T, query url.Values, contentType string, body io.Reader, hdr map[string]string) (*http.Response, []uploaded) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+"/files?"+query.Encode(), body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp := e.do(t, req)
	var out []uploaded
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
	}
	return resp, out
}

func (e *env) download(t *testing.T, query url.Values) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.url+"/files?"+query.Encode(), nil)
	resp := e.do(t, req)
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func TestUploadDownload(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	// Multipart, one file, path query = filename; as the non-root user.
	ct, body := multipartBody(t, map[string][]byte{"docs/a.txt": []byte("alpha")}, []string{"docs/a.txt"})
	resp, out := e.upload(t, url.Values{"path": {"docs/a.txt"}, "username": {"tester"}}, ct, body, nil)
	if resp.StatusCode != http.StatusOK || len(out) != 1 || out[0] != (uploaded{filepath.Join(e.userDir, "docs/a.txt"), "a.txt", "file"}) {
		t.Fatalf("upload: %d %v", resp.StatusCode, out)
	}
	for _, p := range []string{"docs", "docs/a.txt"} {
		fi, err := os.Stat(filepath.Join(e.userDir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != testUID || st.Gid != testUID {
			t.Errorf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
	resp, got := e.download(t, url.Values{"path": {"docs/a.txt"}, "username": {"tester"}})
	if resp.StatusCode != http.StatusOK || string(got) != "alpha" || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("download: %d %q %v", resp.StatusCode, got, resp.Header)
	}

	// Multipart, several files, no path query, absolute and relative names;
	// existing files are overwritten.
	abs := filepath.Join(e.rootDir, "abs", "b.bin")
	ct, body = multipartBody(t, map[string][]byte{"rel/c.txt": []byte("c"), abs: {0, 1, 2}}, []string{"rel/c.txt", abs})
	resp, out = e.upload(t, nil, ct, body, nil)
	if resp.StatusCode != http.StatusOK || len(out) != 2 || out[0].Path != filepath.Join(e.rootDir, "rel/c.txt") || out[1].Path != abs {
		t.Fatalf("multi upload: %d %v", resp.StatusCode, out)
	}
	ct, body = multipartBody(t, map[string][]byte{"rel/c.txt": []byte("again")}, []string{"rel/c.txt"})
	if resp, _ = e.upload(t, nil, ct, body, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("overwrite: %d", resp.StatusCode)
	}
	if _, got = e.download(t, url.Values{"path": {"rel/c.txt"}}); string(got) != "again" {
		t.Fatalf("after overwrite: %q", got)
	}

	// Raw octet-stream, plain and gzip.
	resp, out = e.upload(t, url.Values{"path": {"raw/plain"}}, "application/octet-stream", strings.NewReader("plain body"), nil)
	if resp.StatusCode != http.StatusOK || len(out) != 1 || out[0].Name != "plain" {
		t.Fatalf("raw upload: %d %v", resp.StatusCode, out)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("compressed body"))
	zw.Close()
	resp, _ = e.upload(t, url.Values{"path": {"raw/gz"}}, "application/octet-stream", &gz, map[string]string{"Content-Encoding": "gzip"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("gzip upload: %d", resp.StatusCode)
	}
	if _, got = e.download(t, url.Values{"path": {"raw/gz"}}); string(got) != "compressed body" {
		t.Fatalf("gzip upload stored %q", got)
	}
}

func TestUploadLargeBinaryRoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	data := make([]byte, 10<<20)
	rand.Read(data)
	// Stream the body through a pipe so nothing is buffered client-side.
	pr, pw := io.Pipe()
	go func() {
		_, err := io.Copy(pw, bytes.NewReader(data))
		pw.CloseWithError(err)
	}()
	resp, _ := e.upload(t, url.Values{"path": {"big.bin"}}, "application/octet-stream", pr, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	resp, got := e.download(t, url.Values{"path": {"big.bin"}})
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("round trip: status %d, %d bytes, equal %v", resp.StatusCode, len(got), bytes.Equal(got, data))
	}
	// Multipart too.
	ct, body := multipartBody(t, map[string][]byte{"big2.bin": data}, []string{"big2.bin"})
	if resp, _ := e.upload(t, nil, ct, body, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("multipart upload: %d", resp.StatusCode)
	}
	if _, got := e.download(t, url.Values{"path": {"big2.bin"}}); !bytes.Equal(got, data) {
		t.Fatal("multipart round trip differs")
	}
}

func TestFilesBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := os.Mkdir(filepath.Join(e.rootDir, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.rootDir, "file"), "x")
	ctDup, bodyDup := multipartBody(t, map[string][]byte{"x": nil, "y": nil}, []string{"x", "y"})
	var emptyMP bytes.Buffer
	mw := multipart.NewWriter(&emptyMP)
	mw.WriteField("other", "v")
	mw.Close()
	cases := []struct {
		name   string
		method string
		query  url.Values
		ct     string
		body   io.Reader
		hdr    map[string]string
		status int
	}{
		{"download directory", "GET", url.Values{"path": {"dir"}}, "", nil, nil, 400},
		{"download missing", "GET", url.Values{"path": {"missing"}}, "", nil, nil, 404},
		{"download no path", "GET", nil, "", nil, nil, 400},
		{"download unknown user", "GET", url.Values{"path": {"file"}, "username": {"ghost"}}, "", nil, nil, 400},
		{"download below file", "GET", url.Values{"path": {"file/x"}}, "", nil, nil, 400},
		{"download nul", "GET", url.Values{"path": {"a\x00b"}}, "", nil, nil, 400},
		{"raw without path", "POST", nil, "application/octet-stream", strings.NewReader("x"), nil, 400},
		{"raw onto directory", "POST", url.Values{"path": {"dir"}}, "application/octet-stream", strings.NewReader("x"), nil, 400},
		{"raw below a file", "POST", url.Values{"path": {"file/x"}}, "application/octet-stream", strings.NewReader("x"), nil, 400},
		{"bad gzip", "POST", url.Values{"path": {"g"}}, "application/octet-stream", strings.NewReader("not gzip"), map[string]string{"Content-Encoding": "gzip"}, 400},
		{"unknown encoding", "POST", url.Values{"path": {"g"}}, "application/octet-stream", strings.NewReader("x"), map[string]string{"Content-Encoding": "br"}, 415},
		{"unknown content type", "POST", url.Values{"path": {"g"}}, "text/plain", strings.NewReader("x"), nil, 400},
		{"bad content type", "POST", url.Values{"path": {"g"}}, "multipart/form-data; boundary", strings.NewReader("x"), nil, 400},
		{"multipart no boundary", "POST", nil, "multipart/form-data", strings.NewReader("x"), nil, 400},
		{"multipart garbage", "POST", nil, "multipart/form-data; boundary=zz", strings.NewReader("garbage"), nil, 400},
		{"multipart no file part", "POST", nil, mw.FormDataContentType(), &emptyMP, nil, 400},
		{"multipart two parts one path", "POST", url.Values{"path": {"same"}}, ctDup, bodyDup, nil, 400},
		{"wrong method", "DELETE", url.Values{"path": {"file"}}, "", nil, nil, 405},
		{"unknown route", "GET", nil, "", nil, nil, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := e.url + "/files?" + c.query.Encode()
			if c.name == "unknown route" {
				u = e.url + "/nope"
			}
			req, _ := http.NewRequest(c.method, u, c.body)
			if c.ct != "" {
				req.Header.Set("Content-Type", c.ct)
			}
			for k, v := range c.hdr {
				req.Header.Set(k, v)
			}
			resp := e.do(t, req)
			if resp.StatusCode != c.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, c.status)
			}
			var msg struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || msg.Code != c.status || msg.Message == "" {
				t.Fatalf("error body %+v (%v)", msg, err)
			}
		})
	}
}

func TestUploadDiskFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	mnt := filepath.Join(e.rootDir, "small")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	resp, _ := e.upload(t, url.Values{"path": {"small/f"}}, "application/octet-stream", bytes.NewReader(make([]byte, 1<<20)), nil)
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("status %d, want 507", resp.StatusCode)
	}
}

func TestUploadWithoutTokenButSigned(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envd.Config) { c.AccessToken = "secret-token" })
	writeFile(t, filepath.Join(e.rootDir, "s.txt"), "signed")
	get := func(q url.Values) int {
		resp, err := http.Get(e.url + "/files?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(url.Values{"path": {"s.txt"}}); got != 401 {
		t.Fatalf("unsigned: %d", got)
	}
	sig := filesSign("s.txt", "read", "", "secret-token", 0)
	if got := get(url.Values{"path": {"s.txt"}, "signature": {sig}}); got != 200 {
		t.Fatalf("signed read: %d", got)
	}
	if got := get(url.Values{"path": {"other"}, "signature": {sig}}); got != 401 {
		t.Fatalf("signature for another path: %d", got)
	}
	exp := int64(4102444800) // 2100-01-01
	sig = filesSign("s.txt", "read", "tester", "secret-token", exp)
	if got := get(url.Values{"path": {"s.txt"}, "username": {"tester"}, "signature": {sig}, "signature_expiration": {fmt.Sprint(exp)}}); got != 404 {
		// Authorised; tester's home has no s.txt.
		t.Fatalf("signed with expiration: %d", got)
	}
	old := int64(1000)
	sig = filesSign("s.txt", "read", "", "secret-token", old)
	if got := get(url.Values{"path": {"s.txt"}, "signature": {sig}, "signature_expiration": {fmt.Sprint(old)}}); got != 401 {
		t.Fatalf("expired: %d", got)
	}
	// A read signature does not allow writes.
	sig = filesSign("w.txt", "read", "", "secret-token", 0)
	resp, err := http.Post(e.url+"/files?"+url.Values{"path": {"w.txt"}, "signature": {sig}}.Encode(), "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("write with read signature: %d", resp.StatusCode)
	}
	sig = filesSign("w.txt", "write", "", "secret-token", 0)
	resp, err = http.Post(e.url+"/files?"+url.Values{"path": {"w.txt"}, "signature": {sig}}.Encode(), "application/octet-stream", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("write with write signature: %d", resp.StatusCode)
	}
}
