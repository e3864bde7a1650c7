package interp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// needKernel skips (fails under CI=1) when this machine has no Python
// kernel: the tests run real ipykernel processes (`make deps` installs
// python3-ipykernel, -numpy, -pandas, -matplotlib).
func needKernel(t *testing.T) {
	t.Helper()
	k, err := FindKernels(DefaultKernelDirs)
	if err == nil {
		if _, err = k.Lookup("python"); err == nil {
			return
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("no python kernel (run make deps): %v", err)
	}
	t.Skipf("no python kernel (run make deps): %v", err)
}

// testServer is an Interp behind an HTTP server, talked to as the client does.
type testServer struct {
	t   *testing.T
	it  *Interp
	url string
}

func startServer(t *testing.T, cfg Config) *testServer {
	t.Helper()
	needKernel(t)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.Cwd == "" {
		cfg.Cwd = t.TempDir()
	}
	it, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(it.Handler())
	t.Cleanup(func() {
		srv.Close()
		it.Close()
	})
	return &testServer{t: t, it: it, url: srv.URL}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// do sends a request with the headers @e2b/code-interpreter sends and
// returns status and body.
func (s *testServer) do(ctx context.Context, method, path string, body any, hdr map[string]string) (int, []byte) {
	s.t.Helper()
	var rd io.Reader
	if raw, ok := body.([]byte); ok {
		rd = bytes.NewReader(raw)
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("E2b-Sandbox-Id", "sbx-test")
	req.Header.Set("E2b-Sandbox-Port", "49999")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil && ctx.Err() == nil {
		s.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, b
}

// run executes body (an ExecuteRequest as the client sends it) and returns
// the stream as the client reads it.
func (s *testServer) run(body map[string]any) execution {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	status, b := s.do(ctx, "POST", "/execute", body, map[string]string{"X-Access-Token": "tok"})
	if status != http.StatusOK {
		s.t.Fatalf("POST /execute %v: %d %s", body, status, b)
	}
	ex := parseStream(s.t, b)
	if !ex.ended {
		s.t.Fatalf("stream of %v has no end_of_execution:\n%s", body, b)
	}
	return ex
}

func (s *testServer) code(code string) execution { return s.run(map[string]any{"code": code}) }

// execution is what @e2b/code-interpreter 2.8.0 builds from the stream
// (dist/index.js parseOutput), plus the raw lines.
type execution struct {
	results        []map[string]any
	stdout, stderr []string
	err            map[string]any
	executionCount int
	ended          bool
	lines          []map[string]any
}

// text is Execution.text: the main result's text.
func (e execution) text() string {
	for _, r := range e.results {
		if r["is_main_result"] == true {
			s, _ := r["text"].(string)
			return s
		}
	}
	return ""
}

// parseStream reads newline-delimited JSON the way the client does: every
// line is JSON, unknown types are ignored.
func parseStream(t *testing.T, b []byte) execution {
	t.Helper()
	var ex execution
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line is not JSON (the client would throw): %q: %v", sc.Text(), err)
		}
		ex.lines = append(ex.lines, m)
		switch m["type"] {
		case "result":
			ex.results = append(ex.results, m)
		case "stdout":
			ex.stdout = append(ex.stdout, m["text"].(string))
		case "stderr":
			ex.stderr = append(ex.stderr, m["text"].(string))
		case "error":
			ex.err = m
		case "number_of_executions":
			ex.executionCount = int(m["execution_count"].(float64))
		case "end_of_execution":
			ex.ended = true
		}
	}
	return ex
}

// types lists the line types in order.
func (e execution) types() []string {
	var out []string
	for _, l := range e.lines {
		out = append(out, l["type"].(string))
	}
	return out
}
