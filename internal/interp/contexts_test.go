package interp

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// contextInfo is the Context object the client gets.
type contextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *testServer) createContext(body map[string]any) (int, contextInfo) {
	s.t.Helper()
	status, b := s.do(context.Background(), "POST", "/contexts", body, nil)
	var c contextInfo
	if status == http.StatusOK {
		if err := json.Unmarshal(b, &c); err != nil {
			s.t.Fatalf("context %s: %v", b, err)
		}
	}
	return status, c
}

func TestContexts(t *testing.T) {
	s := startServer(t, Config{})
	dir := t.TempDir()
	status, c := s.createContext(map[string]any{"language": "python", "cwd": dir})
	if status != http.StatusOK || c.ID == "" || c.Language != "python" || c.Cwd != dir {
		t.Fatalf("create: %d %+v", status, c)
	}
	// Its cwd is the one asked for; its state is its own.
	if ex := s.run(map[string]any{"code": "import os\nos.getcwd()", "context_id": c.ID}); ex.text() != dir {
		t.Errorf("cwd %q, want %q", ex.text(), dir)
	}
	s.code("v = 'default'")
	s.run(map[string]any{"code": "v = 'second'", "context_id": c.ID})
	if ex := s.code("v"); ex.text() != "default" {
		t.Errorf("default context sees %q", ex.text())
	}
	if ex := s.run(map[string]any{"code": "v", "context_id": c.ID}); ex.text() != "second" {
		t.Errorf("second context sees %q", ex.text())
	}
	if ex := s.run(map[string]any{"code": "v", "language": "python"}); ex.text() != "default" {
		t.Errorf("language python runs in %q, want the default context", ex.text())
	}

	// List: the default context and the new one.
	_, b := s.do(context.Background(), "GET", "/contexts", nil, nil)
	var list []contextInfo
	if err := json.Unmarshal(b, &list); err != nil || len(list) != 2 {
		t.Fatalf("list: %s (%v)", b, err)
	}

	// Restart clears state.
	if status, b := s.do(context.Background(), "POST", "/contexts/"+c.ID+"/restart", nil, nil); status != http.StatusOK {
		t.Fatalf("restart: %d %s", status, b)
	}
	if ex := s.run(map[string]any{"code": "v", "context_id": c.ID}); ex.err == nil || ex.err["name"] != "NameError" {
		t.Errorf("after restart: %v", ex.lines)
	}
	if ex := s.code("v"); ex.text() != "default" {
		t.Errorf("restart of another context touched the default: %v", ex.lines)
	}

	// Remove: gone for executions, restart and list.
	if status, _ := s.do(context.Background(), "DELETE", "/contexts/"+c.ID, nil, nil); status != http.StatusOK {
		t.Fatalf("remove: %d", status)
	}
	for _, r := range []struct{ method, path string }{{"DELETE", "/contexts/" + c.ID}, {"POST", "/contexts/" + c.ID + "/restart"}} {
		if status, _ := s.do(context.Background(), r.method, r.path, nil, nil); status != http.StatusNotFound {
			t.Errorf("%s %s after remove: %d", r.method, r.path, status)
		}
	}
	status, b = s.do(context.Background(), "POST", "/execute", map[string]any{"code": "1", "context_id": c.ID}, nil)
	if status != http.StatusNotFound || !strings.Contains(string(b), c.ID) {
		t.Errorf("execute in removed context: %d %s", status, b)
	}
}

// Requests the client can send wrong get clear 4xx answers.
func TestBadRequests(t *testing.T) {
	s := startServer(t, Config{})
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path string
		body               any
		status             int
		says               string
	}{
		{"unknown language", "POST", "/execute", map[string]any{"code": "1", "language": "cobol"}, 400, "available: python"},
		{"unknown context", "POST", "/execute", map[string]any{"code": "1", "context_id": "nope"}, 404, "nope"},
		{"context and language", "POST", "/execute", map[string]any{"code": "1", "context_id": "x", "language": "python"}, 400, "only one"},
		{"no code", "POST", "/execute", map[string]any{}, 400, "code is required"},
		{"not JSON", "POST", "/execute", []byte("{"), 400, "request body"},
		{"create unknown language", "POST", "/contexts", map[string]any{"language": "r"}, 400, "available: python"},
		{"create missing cwd", "POST", "/contexts", map[string]any{"cwd": "/does/not/exist"}, 400, "does not exist"},
		{"create cwd file", "POST", "/contexts", map[string]any{"cwd": file}, 400, "not a directory"},
		{"create relative cwd", "POST", "/contexts", map[string]any{"cwd": "rel"}, 400, "absolute"},
		{"restart unknown", "POST", "/contexts/nope/restart", nil, 404, "not found"},
		{"remove unknown", "DELETE", "/contexts/nope", nil, 404, "not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, b := s.do(context.Background(), tc.method, tc.path, tc.body, nil)
			if status != tc.status || !strings.Contains(string(b), tc.says) {
				t.Errorf("%d %s, want %d containing %q", status, b, tc.status, tc.says)
			}
		})
	}
}

// A restart while an execution runs ends it with a clear error.
func TestRestartDuringExecution(t *testing.T) {
	s := startServer(t, Config{})
	_, c := s.createContext(map[string]any{})
	var wg sync.WaitGroup
	var ex execution
	wg.Add(1)
	go func() {
		defer wg.Done()
		ex = s.run(map[string]any{"code": "import time\ntime.sleep(60)", "context_id": c.ID})
	}()
	time.Sleep(time.Second)
	if status, b := s.do(context.Background(), "POST", "/contexts/"+c.ID+"/restart", nil, nil); status != http.StatusOK {
		t.Fatalf("restart: %d %s", status, b)
	}
	wg.Wait()
	if ex.err == nil || ex.err["name"] != "ContextRestarting" {
		t.Errorf("running execution: %v", ex.lines)
	}
	if ex := s.run(map[string]any{"code": "3", "context_id": c.ID}); ex.text() != "3" {
		t.Errorf("after restart: %v", ex.lines)
	}
}
