package envd

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestLoggerWritesJSONLinesToThePipe(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(p, os.O_RDWR, 0) // the node's end
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l := newLogger(p)
	l.Info("envd listening", "addr", "0.0.0.0:49983")
	l.With("logger", "process").Warn("process ended", "exitCode", 3, "args", strings.Repeat("a", 5000))
	br := bufio.NewReader(r)
	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i, want := range []map[string]any{
		{"level": "INFO", "msg": "envd listening", "addr": "0.0.0.0:49983"},
		{"level": "WARN", "msg": "process ended", "logger": "process", "exitCode": 3.0},
	} {
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		if len(line) > pipeLineMax {
			t.Errorf("line %d is %d bytes, more than PIPE_BUF", i, len(line))
		}
		var got map[string]any
		if err := json.Unmarshal(line, &got); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %v", i, k, got[k], v)
			}
		}
		if _, ok := got["time"]; !ok {
			t.Errorf("line %d has no time", i)
		}
	}
}

// Nobody reads: envd must neither block nor fail, only drop.
func TestPipeWriterNeverBlocks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := unix.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := openLogPipe(p)
	if err != nil || w == nil {
		t.Fatalf("open: %v %v", w, err)
	}
	defer unix.Close(w.fd)
	line := []byte(strings.Repeat("x", 1000) + "\n")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2000 { // ~2 MB, far more than a pipe holds
			if n, err := w.Write(line); n != len(line) || err != nil {
				t.Errorf("write: %d %v", n, err)
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writes to a full log pipe blocked")
	}
	if w.dropped.Load() == 0 {
		t.Error("no line dropped on a full pipe")
	}
	if w, err := openLogPipe(filepath.Join(t.TempDir(), "missing")); w != nil || err != nil {
		t.Errorf("missing pipe: %v %v, want nil, nil", w, err)
	}
}
