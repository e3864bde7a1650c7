package sandboxlog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/nodeproto"
)

// writer opens the FIFO as envd does: read-write, non-blocking.
func writer(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func writeLine(t *testing.T, fd int, s string) {
	t.Helper()
	if _, err := unix.Write(fd, []byte(s+"\n")); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

func waitLines(t *testing.T, s *Store, id string, n int) []nodeproto.LogEntry {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := s.Read(id, nodeproto.LogQuery{Limit: nodeproto.MaxLogLimit})
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines after 5s, want %d: %+v", len(got), n, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMakePipe(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, PipeFile)
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	for range 2 { // idempotent
		if err := MakePipe(p); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Lstat(p)
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 || fi.Mode().Perm() != 0o666 {
		t.Fatalf("pipe: %v %v", fi.Mode(), err)
	}
	reg := filepath.Join(dir, "regular")
	os.WriteFile(reg, nil, 0o644)
	if err := MakePipe(reg); err == nil {
		t.Fatal("MakePipe over a regular file succeeded")
	}
	s := openStore(t, Config{})
	if _, err := s.Follow("sb1", reg, nil); err == nil {
		t.Fatal("Follow of a regular file succeeded")
	}
	if _, err := s.Follow("sb1", filepath.Join(dir, "missing"), nil); err == nil {
		t.Fatal("Follow of a missing pipe succeeded")
	}
}

// Lines survive the reader going away (the node agent restarting): the
// kernel buffer keeps them, and a new store's follower on the same FIFO
// reads them.
func TestFollowAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, PipeFile)
	if err := MakePipe(p); err != nil {
		t.Fatal(err)
	}
	logs := filepath.Join(dir, "logs")
	s := openStore(t, Config{Dir: logs})
	fw, err := s.Follow("sb1", p, func(err error) { t.Error(err) })
	if err != nil {
		t.Fatal(err)
	}
	w := writer(t, p)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	writeLine(t, w, `{"time":"`+now+`","level":"INFO","msg":"envd listening","addr":"0.0.0.0:49983"}`)
	writeLine(t, w, `{"time":"`+now+`","level":"WARN","logger":"process","msg":"process ended","pid":42,"exitCode":1}`)
	got := waitLines(t, s, "sb1", 2)
	if got[0].Message != "envd listening" || got[0].Logger != "envd" || got[0].Fields["addr"] != "0.0.0.0:49983" {
		t.Errorf("first line: %+v", got[0])
	}
	if got[1].Level != "warn" || got[1].Logger != "process" || got[1].Fields["pid"] != "42" || got[1].Fields["exitCode"] != "1" {
		t.Errorf("second line: %+v", got[1])
	}
	fw.Stop(0)

	// No reader: the writer neither blocks nor fails.
	writeLine(t, w, `{"level":"INFO","msg":"while the node restarts"}`)
	s2 := openStore(t, Config{Dir: logs})
	fw2, err := s2.Follow("sb1", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	got = waitLines(t, s2, "sb1", 3)
	if got[2].Message != "while the node restarts" {
		t.Errorf("line written during the restart: %+v", got[2])
	}
	// Stop with a grace reads what is still in the pipe.
	writeLine(t, w, `{"level":"ERROR","msg":"last words"}`)
	fw2.Stop(200 * time.Millisecond)
	got, _ = s2.Read("sb1", nodeproto.LogQuery{Backward: true, Limit: 1})
	if len(got) != 1 || got[0].Message != "last words" || got[0].Level != "error" {
		t.Errorf("last line after Stop with grace: %+v", got)
	}
}

// Stop returns once the pipe is drained, not when the grace runs out (the
// node keeps the FIFO open, so the reader never sees end-of-file): every
// kill stops a follower, and waiting out the grace cost each kill 200 ms.
// What was in the pipe is still read.
func TestStopReturnsOnceDrained(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, PipeFile)
	if err := MakePipe(p); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, Config{Dir: filepath.Join(dir, "logs")})
	fw, err := s.Follow("sb1", p, func(err error) { t.Error(err) })
	if err != nil {
		t.Fatal(err)
	}
	w := writer(t, p)
	for i := 0; i < 100; i++ {
		writeLine(t, w, fmt.Sprintf(`{"level":"INFO","msg":"line %d"}`, i))
	}
	const grace = 10 * time.Second
	start := time.Now()
	fw.Stop(grace)
	if took := time.Since(start); took > grace/2 {
		t.Errorf("Stop waited %s of its %s grace with the pipe drained", took, grace)
	}
	got, _ := s.Read("sb1", nodeproto.LogQuery{Backward: true, Limit: 1})
	if len(got) != 1 || got[0].Message != "line 99" {
		t.Errorf("last line after Stop: %+v", got)
	}
}

// A sandbox that writes as fast as it can is cut to the rate, and the
// store says how many lines it dropped.
func TestFollowRateLimit(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, PipeFile)
	if err := MakePipe(p); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, Config{Dir: filepath.Join(dir, "logs")})
	fw, err := s.Follow("sb1", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Stop(0)
	w := writer(t, p)
	sent := 0
	for i := 0; i < 3*pipeBurst; i++ {
		if _, err := unix.Write(w, []byte(fmt.Sprintf(`{"msg":"flood %d"}`+"\n", i))); err == nil {
			sent++
		} else {
			time.Sleep(time.Millisecond) // pipe full: let the reader catch up
		}
	}
	time.Sleep(1100 * time.Millisecond) // a second's worth of tokens
	writeLine(t, w, `{"msg":"after the flood"}`)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := s.Read("sb1", nodeproto.LogQuery{Search: "dropped"})
		if len(got) >= 1 && got[0].Logger == "cubelet" && got[0].Level == "warn" && got[0].Fields["dropped"] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dropped-lines note: %+v", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	all, _ := s.Read("sb1", nodeproto.LogQuery{Limit: nodeproto.MaxLogLimit})
	if len(all) > pipeBurst+2*pipeRate+2 {
		t.Fatalf("stored %d of %d lines: the rate limit did not hold", len(all), sent)
	}
}

func TestParseLine(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	b.WriteString(`{"msg":"many"`)
	for i := range 100 {
		fmt.Fprintf(&b, `,"k%d":%d`, i, i)
	}
	b.WriteString(`}`)
	for _, tc := range []struct {
		in   string
		want nodeproto.LogEntry
	}{
		{`not json`, nodeproto.LogEntry{Time: now, Level: "info", Logger: "envd", Message: "not json"}},
		{`{"time":"2026-12-01T12:00:01Z","level":"DEBUG","msg":"x"}`,
			nodeproto.LogEntry{Time: now.Add(time.Second), Level: "debug", Logger: "envd", Message: "x"}},
		// A time far from now is the sandbox's to invent, not to keep.
		{`{"time":"2000-01-01T00:00:00Z","level":"WARNING","msg":"x"}`,
			nodeproto.LogEntry{Time: now, Level: "warn", Logger: "envd", Message: "x"}},
		// Lifecycle lines are the node's: a sandbox cannot pass for it.
		{`{"level":"FATAL","logger":"cubelet","msg":"sandbox died"}`,
			nodeproto.LogEntry{Time: now, Level: "info", Logger: "envd", Message: "sandbox died"}},
		{`{"msg":"f","n":null,"o":{"a":1},"s":"v"}`,
			nodeproto.LogEntry{Time: now, Level: "info", Logger: "envd", Message: "f", Fields: map[string]string{"n": "", "o": `{"a":1}`, "s": "v"}}},
	} {
		got := ParseLine([]byte(tc.in), now)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("ParseLine(%s) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	if got := ParseLine([]byte(b.String()), now); len(got.Fields) != maxFields {
		t.Errorf("%d fields kept, want %d", len(got.Fields), maxFields)
	}
}
