package sandboxlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
)

func openStore(t *testing.T, cfg Config) *Store {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func entry(t0 time.Time, i int, level, msg string) nodeproto.LogEntry {
	return nodeproto.LogEntry{Time: t0.Add(time.Duration(i) * time.Millisecond), Level: level, Logger: "envd", Message: msg}
}

func TestReadFilters(t *testing.T) {
	s := openStore(t, Config{})
	t0 := time.Now().Truncate(time.Millisecond)
	levels := []string{"debug", "info", "warn", "error"}
	for i := range 8 {
		if err := s.Append("sb1", entry(t0, i, levels[i%4], fmt.Sprintf("line %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	msgs := func(es []nodeproto.LogEntry) string {
		var out []string
		for _, e := range es {
			out = append(out, strings.TrimPrefix(e.Message, "line "))
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		name string
		q    nodeproto.LogQuery
		want string
	}{
		{"all", nodeproto.LogQuery{}, "0,1,2,3,4,5,6,7"},
		{"limit", nodeproto.LogQuery{Limit: 3}, "0,1,2"},
		{"cursor forward, inclusive", nodeproto.LogQuery{Cursor: t0.Add(5 * time.Millisecond)}, "5,6,7"},
		{"backward from the end", nodeproto.LogQuery{Backward: true, Limit: 2}, "7,6"},
		{"backward from a cursor", nodeproto.LogQuery{Backward: true, Cursor: t0.Add(2 * time.Millisecond)}, "2,1,0"},
		{"min level warn", nodeproto.LogQuery{MinLevel: "warn"}, "2,3,6,7"},
		{"min level error", nodeproto.LogQuery{MinLevel: "error"}, "3,7"},
		{"search", nodeproto.LogQuery{Search: "line 4"}, "4"},
		{"search is case-sensitive", nodeproto.LogQuery{Search: "LINE"}, ""},
	} {
		got, err := s.Read("sb1", tc.q)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if msgs(got) != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, msgs(got), tc.want)
		}
	}
	if _, err := s.Read("nope", nodeproto.LogQuery{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown sandbox: %v, want NotFound", err)
	}
	for _, bad := range []string{"../x", "a/b", "", strings.Repeat("a", 65)} {
		if err := s.Append(bad, entry(t0, 0, "info", "x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Append(%q): %v, want InvalidArgument", bad, err)
		}
		if _, err := s.Read(bad, nodeproto.LogQuery{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Read(%q): %v, want NotFound", bad, err)
		}
	}
}

// The bound holds however much is appended: older lines go, the newest stay.
func TestBound(t *testing.T) {
	const max = 64 << 10
	s := openStore(t, Config{MaxBytes: max})
	t0 := time.Now()
	msg := strings.Repeat("x", 200)
	for i := range 5000 {
		if err := s.Append("sb1", entry(t0, i, "info", fmt.Sprintf("%05d %s", i, msg))); err != nil {
			t.Fatal(err)
		}
	}
	if n := dirSize(s.dir("sb1")); n > max {
		t.Fatalf("log is %d bytes, bound %d", n, max)
	}
	got, err := s.Read("sb1", nodeproto.LogQuery{Backward: true, Limit: 1})
	if err != nil || len(got) != 1 || !strings.HasPrefix(got[0].Message, "04999 ") {
		t.Fatalf("newest line: %v %v", got, err)
	}
	all, _ := s.Read("sb1", nodeproto.LogQuery{Limit: nodeproto.MaxLogLimit})
	if len(all) < 100 || strings.HasPrefix(all[0].Message, "00000 ") {
		t.Fatalf("kept %d lines starting with %q: want the newest ~half bound's worth", len(all), all[0].Message)
	}
	// One huge message is cut, not refused.
	if err := s.Append("sb2", entry(t0, 0, "info", strings.Repeat("y", 1<<20))); err != nil {
		t.Fatal(err)
	}
	got, _ = s.Read("sb2", nodeproto.LogQuery{})
	if len(got) != 1 || len(got[0].Message) > maxMessageBytes+8 {
		t.Fatalf("huge message stored as %d lines, first %d bytes", len(got), len(got[0].Message))
	}
}

func TestRetentionAndEviction(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, Config{Dir: dir, Retention: time.Hour, MaxEndedBytes: 3000})
	now := time.Now()
	for _, id := range []string{"old", "mid", "new", "running", "orphan"} {
		for i := range 10 {
			if err := s.Append(id, entry(now, i, "info", strings.Repeat("z", 50))); err != nil {
				t.Fatal(err)
			}
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.End("old", now.Add(-2*time.Hour)))
	must(s.End("mid", now.Add(-30*time.Minute)))
	must(s.End("new", now.Add(-time.Minute)))
	must(s.End("new", now)) // the first end wins
	live := map[string]bool{"running": true, "old": false}
	rep, err := s.GC(now, func(id string) bool { return live[id] })
	must(err)
	// old: past the retention. orphan: no end mark and not live: marked
	// ended now. Ended logs are ~1 KiB each, bound 3000: mid (the oldest
	// left) is evicted.
	if rep.Expired != 1 || rep.MarkedEnd != 1 || rep.Evicted != 1 {
		t.Fatalf("gc report %+v, want 1 expired, 1 marked, 1 evicted", rep)
	}
	for id, want := range map[string]bool{"old": false, "mid": false, "new": true, "running": true, "orphan": true} {
		_, err := s.Read(id, nodeproto.LogQuery{})
		if got := err == nil; got != want {
			t.Errorf("%s kept = %v, want %v (%v)", id, got, want, err)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, "new", endedFile))
	must(err)
	if fi.ModTime().Sub(now.Add(-time.Minute)).Abs() > time.Second {
		t.Errorf("end time %v, want the first End's %v", fi.ModTime(), now.Add(-time.Minute))
	}
	// The running sandbox's log is never collected, however old.
	rep, err = s.GC(now.Add(100*time.Hour), func(id string) bool { return id == "running" })
	must(err)
	if _, err := s.Read("running", nodeproto.LogQuery{}); err != nil {
		t.Errorf("running sandbox's log collected: %v (%+v)", err, rep)
	}
	if _, err := s.Read("new", nodeproto.LogQuery{}); err == nil {
		t.Error("ended log kept past the retention")
	}
}

// A store reopened on the same directory (the node agent restarted) reads
// what the previous one wrote, torn last lines skipped.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, Config{Dir: dir})
	t0 := time.Now()
	if err := s.Append("sb1", entry(t0, 0, "info", "before")); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "sb1", currentFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"t":"2026-01-01T00:00:00Z","level":"info","msg":"torn`) // a crash mid-write
	f.Close()
	s2 := openStore(t, Config{Dir: dir})
	if err := s2.Append("sb1", entry(t0, 1, "info", "after")); err != nil {
		t.Fatal(err)
	}
	got, err := s2.Read("sb1", nodeproto.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Message != "before" || got[1].Message != "after" {
		t.Fatalf("after reopen: %+v, want before and after (the torn line skipped)", got)
	}
}
