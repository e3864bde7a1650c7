// Package sandboxlog is a node's store of sandbox logs: envd's own lines
// (read from a pipe the sandbox writes into, see pipe.go) and the node's
// lifecycle lines for each sandbox, kept per sandbox with a size bound,
// while the sandbox lives and for a retention after it ended.
//
// On disk, under the store's directory, one directory per sandbox id:
//
//	<id>/log.jsonl     current lines, one JSON object (line) per line
//	<id>/log.1.jsonl   the previous file, once log.jsonl reached half the bound
//	<id>/ended         present once the sandbox ended; its time is the end
//
// Only the node agent writes these files (never the sandbox), so a sandbox
// cannot make them grow past the bound. The store does not log: callers do.
package sandboxlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// Defaults of Config.
const (
	DefaultMaxBytes      = 1 << 20        // per sandbox: two files of half that
	DefaultRetention     = 24 * time.Hour // after a sandbox ended
	DefaultMaxEndedBytes = 512 << 20      // all ended sandboxes' logs on a node
	maxLineBytes         = 16 << 10       // one stored line, fields included
	maxMessageBytes      = 4 << 10        // one message
)

// Files in a sandbox's log directory.
const (
	currentFile  = "log.jsonl"
	previousFile = "log.1.jsonl"
	endedFile    = "ended"
)

// Config bounds a Store.
type Config struct {
	Dir           string
	MaxBytes      int64         // per sandbox; 0: DefaultMaxBytes
	Retention     time.Duration // after the end; 0: DefaultRetention
	MaxEndedBytes int64         // all ended logs; 0: DefaultMaxEndedBytes
}

// Store keeps the logs of a node's sandboxes. Its methods are safe for
// concurrent use.
type Store struct {
	cfg Config
	mu  sync.Mutex // serialises writes (appends, rotation, end, GC)
}

// Open returns the store in cfg.Dir, creating the directory.
func Open(cfg Config) (*Store, error) {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxEndedBytes <= 0 {
		cfg.MaxEndedBytes = DefaultMaxEndedBytes
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox log dir: %w", err)
	}
	return &Store{cfg: cfg}, nil
}

// line is one stored line (schema of log.jsonl).
type line struct {
	Time    time.Time         `json:"t"`
	Level   string            `json:"level"`
	Logger  string            `json:"logger"`
	Message string            `json:"msg"`
	Fields  map[string]string `json:"fields,omitempty"`
}

// validID accepts the names sandbox ids and runtime names use, so an id
// can never name a path outside the store.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (s *Store) dir(id string) string { return filepath.Join(s.cfg.Dir, id) }

// Append adds e to the log of sandbox id, rotating when the current file
// would pass half the bound. A line longer than the store keeps is cut.
func (s *Store) Append(id string, e nodeproto.LogEntry) error {
	if !validID(id) {
		return fmt.Errorf("sandbox log %q: %w", id, errdefs.ErrInvalidArgument)
	}
	b, err := encodeLine(e)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := s.dir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox log dir: %w", err)
	}
	cur := filepath.Join(dir, currentFile)
	if fi, err := os.Stat(cur); err == nil && fi.Size()+int64(len(b)) > s.cfg.MaxBytes/2 {
		if err := os.Rename(cur, filepath.Join(dir, previousFile)); err != nil {
			return fmt.Errorf("rotate sandbox log: %w", err)
		}
	}
	f, err := os.OpenFile(cur, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open sandbox log: %w", err)
	}
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		// A line torn by a crash must not swallow this one.
		var last [1]byte
		if _, err := f.ReadAt(last[:], fi.Size()-1); err == nil && last[0] != '\n' {
			b = append([]byte{'\n'}, b...)
		}
	}
	_, werr := f.Write(b)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("write sandbox log: %w", werr)
	}
	return nil
}

func encodeLine(e nodeproto.LogEntry) ([]byte, error) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Level == "" {
		e.Level = "info"
	}
	l := line{Time: e.Time.UTC(), Level: e.Level, Logger: e.Logger, Message: truncate(e.Message, maxMessageBytes), Fields: e.Fields}
	b, err := json.Marshal(l)
	if err != nil {
		return nil, fmt.Errorf("encode sandbox log line: %w", err)
	}
	if len(b) >= maxLineBytes {
		l.Fields = map[string]string{"truncated": "fields dropped: line too long"}
		if b, err = json.Marshal(l); err != nil {
			return nil, fmt.Errorf("encode sandbox log line: %w", err)
		}
	}
	return append(b, '\n'), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// End records that sandbox id ended at t (the first end wins). Its log is
// kept for the retention from then. A sandbox without a log gets one, so
// the end itself can be read.
func (s *Store) End(id string, t time.Time) error {
	if !validID(id) {
		return fmt.Errorf("sandbox log %q: %w", id, errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endLocked(id, t)
}

func (s *Store) endLocked(id string, t time.Time) error {
	dir := s.dir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox log dir: %w", err)
	}
	p := filepath.Join(dir, endedFile)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := os.WriteFile(p, []byte(t.UTC().Format(time.RFC3339Nano)+"\n"), 0o600); err != nil {
		return fmt.Errorf("mark sandbox log ended: %w", err)
	}
	// The end time is the marker's mtime: GC reads no file contents.
	return os.Chtimes(p, t, t)
}

// Read returns the lines of sandbox id that q selects. An id the store has
// no log of is errdefs.ErrNotFound.
func (s *Store) Read(id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error) {
	if !validID(id) {
		return nil, fmt.Errorf("sandbox %q has no logs: %w", id, errdefs.ErrNotFound)
	}
	dir := s.dir(id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %s has no logs on this node: %w", id, errdefs.ErrNotFound)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = nodeproto.DefaultLogLimit
	}
	limit = min(limit, nodeproto.MaxLogLimit)
	var all []nodeproto.LogEntry
	for _, name := range []string{previousFile, currentFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, fmt.Errorf("read sandbox log: %w", err)
		}
		all = appendMatching(all, b, q)
	}
	// Lines are appended in arrival order; envd's own times may disagree
	// by a little, and a query pages by time.
	slices.SortStableFunc(all, func(a, b nodeproto.LogEntry) int { return a.Time.Compare(b.Time) })
	if q.Backward {
		slices.Reverse(all)
	}
	if len(all) > limit {
		all = all[:limit]
	}
	return all, nil
}

func appendMatching(out []nodeproto.LogEntry, b []byte, q nodeproto.LogQuery) []nodeproto.LogEntry {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxLineBytes*2)
	for sc.Scan() {
		var l line
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Time.IsZero() {
			continue // a line torn by a crash mid-write
		}
		if !q.Cursor.IsZero() {
			c := q.Cursor.Truncate(time.Millisecond)
			t := l.Time.Truncate(time.Millisecond)
			if (!q.Backward && t.Before(c)) || (q.Backward && t.After(c)) {
				continue
			}
		}
		if q.MinLevel != "" && !nodeproto.LogLevelAtLeast(l.Level, q.MinLevel) {
			continue
		}
		if q.Search != "" && !strings.Contains(l.Message, q.Search) {
			continue
		}
		out = append(out, nodeproto.LogEntry{Time: l.Time, Level: l.Level, Logger: l.Logger, Message: l.Message, Fields: l.Fields})
	}
	return out
}

// GCReport says what a GC removed.
type GCReport struct {
	Expired   int // ended longer ago than the retention
	Evicted   int // ended within it, removed oldest first to stay under MaxEndedBytes
	MarkedEnd int // logs of sandboxes no longer live, without an end mark
}

// GC removes the logs of sandboxes that ended longer ago than the
// retention, then the oldest ended ones while all ended logs together
// exceed MaxEndedBytes. A log without an end mark whose sandbox live does
// not know (the agent died between a sandbox's end and its mark) is
// marked ended now.
func (s *Store) GC(now time.Time, live func(id string) bool) (GCReport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rep GCReport
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return rep, fmt.Errorf("list sandbox logs: %w", err)
	}
	type ended struct {
		id   string
		at   time.Time
		size int64
	}
	var kept []ended
	var total int64
	var errs []error
	for _, de := range ents {
		id := de.Name()
		if !de.IsDir() || !validID(id) {
			continue
		}
		fi, err := os.Stat(filepath.Join(s.dir(id), endedFile))
		if err != nil {
			if live == nil || live(id) {
				continue
			}
			if err := s.endLocked(id, now); err != nil {
				errs = append(errs, err)
				continue
			}
			rep.MarkedEnd++
			fi, err = os.Stat(filepath.Join(s.dir(id), endedFile))
			if err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if now.Sub(fi.ModTime()) > s.cfg.Retention {
			if err := os.RemoveAll(s.dir(id)); err != nil {
				errs = append(errs, fmt.Errorf("remove sandbox log: %w", err))
				continue
			}
			rep.Expired++
			continue
		}
		size := dirSize(s.dir(id))
		kept = append(kept, ended{id, fi.ModTime(), size})
		total += size
	}
	slices.SortFunc(kept, func(a, b ended) int { return a.at.Compare(b.at) })
	for _, e := range kept {
		if total <= s.cfg.MaxEndedBytes {
			break
		}
		if err := os.RemoveAll(s.dir(e.id)); err != nil {
			errs = append(errs, fmt.Errorf("remove sandbox log: %w", err))
			continue
		}
		total -= e.size
		rep.Evicted++
	}
	return rep, errors.Join(errs...)
}

func dirSize(dir string) int64 {
	var n int64
	for _, name := range []string{currentFile, previousFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			n += fi.Size()
		}
	}
	return n
}
