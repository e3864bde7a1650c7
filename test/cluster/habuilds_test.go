package cluster_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/pgtest"
)

// haServer is one `cube server` replica on the shared database.
type haServer struct {
	name string
	url  string
	args []string
	p    *proc
}

// TestTemplateBuildsAcrossReplicas runs E2B template builds on two real
// `cube server` replicas sharing one PostgreSQL database and a cubelet:
// a build requested and started through replica A has its COPY upload
// PUT to replica B and its status read through B, and succeeds although B
// restarts while it runs; a build running on A when A is killed (SIGKILL)
// is failed by B within the liveness bound, and its sandbox killed.
func TestTemplateBuildsAcrossReplicas(t *testing.T) {
	needBins(t)
	dsn := pgtest.New(t).NewDatabase(t)
	c := &cluster{t: t, dir: t.TempDir(), key: "cube_test_" + randHex(8), nodes: map[string]*nodeProc{}}
	startServer := func(s *haServer) {
		s.p = start(t, filepath.Join(c.dir, s.name+".log"), s.args...)
		c.waitFor(s.name+" health", 30*time.Second, func() bool {
			res, err := http.Get(s.url + "/health")
			if err == nil {
				res.Body.Close()
			}
			return err == nil && res.StatusCode == 200
		})
	}
	newServer := func(name string) *haServer {
		port := freePort(t)
		s := &haServer{name: name, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
		s.args = []string{"server", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data-dir", filepath.Join(c.dir, name),
			"--api-key", c.key, "--db", dsn, "--node-down-after", "2s"}
		startServer(s)
		return s
	}
	a := newServer("server-a")
	b := newServer("server-b")
	// The cubelet registers with A; B knows the node from the database.
	c.url, c.server = a.url, a.p
	n := c.addNode("n1")
	call := func(s *haServer, method, path string, body, out any, want int) {
		t.Helper()
		c.url = s.url
		c.call(method, path, body, out, want)
	}
	status := func(s *haServer, tid, bid string) buildInfo {
		t.Helper()
		var st buildInfo
		call(s, http.MethodGet, "/templates/"+tid+"/builds/"+bid+"/status", nil, &st, 200)
		return st
	}
	request := func(s *haServer, name string) (tid, bid string) {
		var r struct{ TemplateID, BuildID string }
		call(s, http.MethodPost, "/v3/templates", map[string]any{"name": name}, &r, 202)
		return r.TemplateID, r.BuildID
	}
	sandboxDirs := func() []string {
		ents, _ := os.ReadDir(filepath.Join(c.dir, n.id, "node", "sandboxes"))
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}

	// Build 1: requested, linked and started through A, uploaded to B.
	tid, bid := request(a, "ha-tpl")
	archive := tarOf(t, "hello.txt", "hello from replica B's upload\n")
	sum := sha256.Sum256(archive)
	hash := hex.EncodeToString(sum[:])
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	call(a, http.MethodGet, "/templates/"+tid+"/files/"+hash, nil, &link, 201)
	if link.Present || link.URL == "" {
		t.Fatalf("file link %+v", link)
	}
	u, err := url.Parse(link.URL)
	if err != nil {
		t.Fatal(err)
	}
	bu, _ := url.Parse(b.url)
	u.Host = bu.Host // the upload lands on the other replica
	put(t, u.String(), archive, 200)
	steps := []map[string]any{
		{"type": "COPY", "args": []string{"hello.txt", "/hello.txt", "root:root"}, "filesHash": hash, "force": false},
		{"type": "RUN", "args": []string{"cat /hello.txt; echo phase-one; sleep 15; echo phase-two", "root"}, "force": false},
	}
	call(a, http.MethodPost, "/v2/templates/"+tid+"/builds/"+bid, map[string]any{"fromTemplate": "tiny", "steps": steps, "force": false}, nil, 202)
	c.waitFor("build 1 running its RUN step (status through B)", 2*time.Minute, func() bool {
		st := status(b, tid, bid)
		if st.Status == "error" {
			t.Fatalf("build 1 failed: %+v", st.Reason)
		}
		return strings.Contains(st.logs(), "phase-one")
	})
	// Restart B while A runs the build.
	b.p.Kill(syscall.SIGTERM)
	startServer(b)
	if st := status(b, tid, bid); st.Status != "building" {
		t.Fatalf("build 1 is %s right after B's restart; the test means to restart B during the build", st.Status)
	}
	var st buildInfo
	c.waitFor("build 1 to end", 2*time.Minute, func() bool {
		st = status(b, tid, bid)
		return st.Status == "ready" || st.Status == "error"
	})
	all := allLogs(t, call, b, tid, bid)
	if st.Status != "ready" {
		t.Fatalf("build 1 ended %s: %+v\nlogs:\n%s\nA:\n%s", st.Status, st.Reason, all, a.p.Tail())
	}
	if !strings.Contains(all, "hello from replica B's upload") || !strings.Contains(all, "phase-two") {
		t.Fatalf("build 1 logs miss the uploaded file or the step's end:\n%s", all)
	}

	// Build 2 runs on A; A is killed; B fails it within the bound and its
	// sandbox goes.
	before := sandboxDirs()
	tid2, bid2 := request(b, "ha-crash")
	call(a, http.MethodPost, "/v2/templates/"+tid2+"/builds/"+bid2, map[string]any{"fromTemplate": "tiny", "force": false,
		"steps": []map[string]any{{"type": "RUN", "args": []string{"echo crash-running; sleep 600", "root"}, "force": false}}}, nil, 202)
	c.waitFor("build 2 running", 2*time.Minute, func() bool {
		st := status(b, tid2, bid2)
		return st.Status == "building" && strings.Contains(st.logs(), "crash-running")
	})
	var buildSandbox string
	for _, d := range sandboxDirs() {
		if !slices.Contains(before, d) {
			buildSandbox = d
		}
	}
	if buildSandbox == "" {
		t.Fatalf("no new sandbox on the node while build 2 runs (before %v, now %v)", before, sandboxDirs())
	}
	killed := time.Now()
	a.p.Kill(syscall.SIGKILL)
	// StaleAfter 30 s + one sweep (5 s) + slack for this shared machine.
	const bound = 30*time.Second + 5*time.Second + 10*time.Second
	c.server = b.p
	c.waitFor("B failing build 2", bound, func() bool {
		st = status(b, tid2, bid2)
		return st.Status == "error"
	})
	took := time.Since(killed)
	if st.Reason == nil || !strings.Contains(st.Reason.Message, "start the build again") {
		t.Fatalf("build 2 reason %+v", st.Reason)
	}
	t.Logf("build 2 failed by B %.1f s after A was killed", took.Seconds())
	c.waitFor("build 2's sandbox "+buildSandbox+" gone from the node", 30*time.Second, func() bool {
		return !slices.Contains(sandboxDirs(), buildSandbox)
	})
	if !strings.Contains(b.p.Read(), "failed an abandoned template build") {
		t.Errorf("B's log does not say it failed the abandoned build")
	}
}

type buildInfo struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Message string `json:"message"`
	} `json:"logEntries"`
	Reason *struct {
		Message string `json:"message"`
	} `json:"reason"`
}

func (b buildInfo) logs() string {
	var s []string
	for _, e := range b.LogEntries {
		s = append(s, e.Message)
	}
	return strings.Join(s, "\n")
}

// allLogs pages through a build's log as the SDK does.
func allLogs(t *testing.T, call func(*haServer, string, string, any, any, int), s *haServer, tid, bid string) string {
	t.Helper()
	var out []string
	for {
		var st buildInfo
		call(s, http.MethodGet, fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", tid, bid, len(out)), nil, &st, 200)
		if len(st.LogEntries) == 0 {
			return strings.Join(out, "\n")
		}
		for _, e := range st.LogEntries {
			out = append(out, e.Message)
		}
	}
}

func tarOf(t *testing.T, name, body string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(tw, body)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// put uploads body to an upload URL (no API key, as the SDK).
func put(t *testing.T, u string, body []byte, want int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, u, bytes.NewReader(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("PUT %s: %s %s", u, res.Status, b)
	}
}
