package envd_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

func TestProcessStartAndEndAreLogged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var buf syncBuffer
	e.srv.SetLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	ctx := testCtx(t, 20*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(startCmd("exit 7")))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var started, ended map[string]any
		for _, l := range buf.lines() {
			switch l["msg"] {
			case "process started":
				started = l
			case "process ended":
				ended = l
			}
		}
		if started != nil && ended != nil {
			if started["logger"] != "process" || started["pid"] != float64(r.pid) || !strings.Contains(started["args"].(string), "exit 7") {
				t.Errorf("started line %v", started)
			}
			if ended["level"] != "WARN" || ended["exitCode"] != 7.0 || ended["pid"] != float64(r.pid) {
				t.Errorf("ended line %v", ended)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log lines: %v", buf.lines())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
