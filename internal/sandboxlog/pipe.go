package sandboxlog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/cube-dev/cube/internal/nodeproto"
)

// A sandbox's envd writes its log lines (slog JSON, one per write, at most
// PIPE_BUF bytes so a write is never torn) into a FIFO that the node made
// in the sandbox's state dir and bound into the sandbox at PipeTarget. The
// sandbox can only fill the pipe's kernel buffer; the node drains it into
// the Store, which bounds what reaches the disk. While the node agent is
// not running (a restart) the buffer keeps the last lines; once it is full
// envd drops lines rather than block. The FIFO lives as long as the state
// dir, so a restarted agent reopens it and reads on.
const (
	PipeFile   = "envd-log.pipe" // in the sandbox's state dir
	PipeTarget = "/.cube/log"    // where envd finds it
	pipeBuffer = 256 << 10       // kernel buffer asked for (best effort)
)

// Lines a sandbox may log per second (and burst): beyond, lines are
// dropped and counted, so a chatty or hostile sandbox costs the node a
// bounded amount of work.
const (
	pipeRate  = 200
	pipeBurst = 2000
)

// MakePipe creates the FIFO at path (an existing FIFO is kept). It is
// world-writable because the sandbox's root may be an unprivileged user on
// the host (user namespaces); it is reachable only through the bind, the
// state dir itself being the node's alone.
func MakePipe(path string) error {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeNamedPipe != 0 {
			return nil
		}
		return fmt.Errorf("sandbox log pipe %s exists and is not a FIFO", path)
	}
	if err := unix.Mkfifo(path, 0o666); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make sandbox log pipe: %w", err)
	}
	// mkfifo obeys the umask.
	if err := os.Chmod(path, 0o666); err != nil {
		return fmt.Errorf("make sandbox log pipe: %w", err)
	}
	return nil
}

// Follower drains one sandbox's pipe into the store. Stop it with Stop.
type Follower struct {
	f    *os.File
	done chan struct{}
}

// Follow opens the FIFO at path and appends every line read from it to the
// log of sandbox id until Stop. The node holds the FIFO open read-write, so
// reads never see end-of-file while the sandbox restarts its writer, and a
// writer never gets EPIPE while the node runs. errf receives store errors
// (rate-limited by the caller's logger, if at all).
func (s *Store) Follow(id, path string, errf func(error)) (*Follower, error) {
	if !validID(id) {
		return nil, fmt.Errorf("sandbox log %q: invalid id", id)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("sandbox log pipe: %w", err)
	}
	if fi.Mode()&os.ModeNamedPipe == 0 {
		return nil, fmt.Errorf("sandbox log pipe %s is not a FIFO", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open sandbox log pipe: %w", err)
	}
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeBuffer) })
	}
	fw := &Follower{f: f, done: make(chan struct{})}
	go func() {
		defer close(fw.done)
		s.drain(id, f, errf)
	}()
	return fw, nil
}

// Stop lets the reader take what the pipe still holds (what the sandbox
// wrote last, e.g. before it died), for up to grace, then stops and waits
// for the reader, which first reports every whole line it has read. It
// stops as soon as the pipe is empty: the node holds the FIFO open
// read-write, so the reader never sees end-of-file, and reading on until
// the grace ran out cost every kill the whole grace (200 ms per kill, the
// most of a kill's latency). Lines left in the pipe stay there for the
// next Follow.
func (fw *Follower) Stop(grace time.Duration) {
	deadline := time.Now().Add(grace)
	for grace > 0 && fw.unread() > 0 && time.Now().Before(deadline) {
		select {
		case <-fw.done:
			deadline = time.Time{} // the reader is gone
		case <-time.After(time.Millisecond):
		}
	}
	_ = fw.f.Close()
	<-fw.done
}

// unread is how many bytes the pipe holds that the reader has not taken.
func (fw *Follower) unread() int {
	rc, err := fw.f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	// TIOCINQ is FIONREAD: the bytes queued in the pipe.
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	return n
}

func (s *Store) drain(id string, r io.Reader, errf func(error)) {
	br := bufio.NewReaderSize(r, 4096)
	lim := rate.NewLimiter(pipeRate, pipeBurst)
	dropped := 0
	for {
		b, err := readLine(br, maxLineBytes)
		if err != nil {
			return // closed by Stop
		}
		if len(b) == 0 {
			continue
		}
		if !lim.Allow() {
			dropped++
			continue
		}
		if dropped > 0 {
			s.report(id, nodeproto.LogEntry{Level: "warn", Logger: "cubelet",
				Message: "sandbox log lines dropped: more than " + strconv.Itoa(pipeRate) + " lines/s",
				Fields:  map[string]string{"dropped": strconv.Itoa(dropped)}}, errf)
			dropped = 0
		}
		s.report(id, ParseLine(b, time.Now()), errf)
	}
}

func (s *Store) report(id string, e nodeproto.LogEntry, errf func(error)) {
	if err := s.Append(id, e); err != nil && errf != nil {
		errf(err)
	}
}

// readLine reads one line, without its newline; a longer line than max is
// cut to max and the rest discarded.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var out []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, err
		}
		if room := max - len(out); room > 0 {
			out = append(out, chunk[:min(len(chunk), room)]...)
		}
		if !isPrefix {
			return out, nil
		}
	}
}

// Bounds on what one pipe line may carry into the store.
const (
	maxFields     = 32
	maxFieldBytes = 1 << 10
	maxClockSkew  = time.Minute
)

// ParseLine turns one line envd wrote (slog's JSON: time, level, msg,
// logger and attributes) into an entry; anything else becomes an info
// line with the text as message. The sandbox wrote it, so nothing is
// trusted: a time far from now is replaced by now, levels are normalised,
// fields are bounded.
func ParseLine(b []byte, now time.Time) nodeproto.LogEntry {
	e := nodeproto.LogEntry{Time: now, Level: "info", Logger: "envd"}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		e.Message = strings.ToValidUTF8(string(b), "?")
		return e
	}
	if t, ok := m["time"].(string); ok {
		if pt, err := time.Parse(time.RFC3339Nano, t); err == nil && pt.Sub(now).Abs() <= maxClockSkew {
			e.Time = pt
		}
	}
	if l, ok := m["level"].(string); ok {
		switch strings.ToLower(l) {
		case "debug":
			e.Level = "debug"
		case "warn", "warning":
			e.Level = "warn"
		case "error":
			e.Level = "error"
		}
	}
	if lg, ok := m["logger"].(string); ok && lg != "" && lg != "cubelet" {
		e.Logger = truncate(lg, 64)
	}
	e.Message, _ = m["msg"].(string)
	for _, k := range []string{"time", "level", "logger", "msg"} {
		delete(m, k)
	}
	for k, v := range m {
		if len(e.Fields) >= maxFields {
			break
		}
		if e.Fields == nil {
			e.Fields = make(map[string]string)
		}
		e.Fields[truncate(k, 64)] = truncate(fieldString(v), maxFieldBytes)
	}
	return e
}

func fieldString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		b, _ := json.Marshal(v) // decoded from JSON: encodes again
		return string(b)
	}
}
