package envd

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// LogPipe is where the node binds the FIFO that carries envd's log lines
// out of the sandbox (sandboxlog.PipeTarget on the node's side). Without
// it (another runtime, tests) envd logs to stderr only.
const LogPipe = "/.cube/log"

// pipeLineMax is PIPE_BUF: a write of at most this many bytes to a pipe is
// all or nothing, also when the pipe is nearly full, so a line is never
// torn. Longer lines are replaced by a short note.
const pipeLineMax = 4096

// pipeWriter writes whole lines to the node's log FIFO without ever
// blocking envd: when the pipe is full (the node is not reading, e.g. while
// its agent restarts) the line is dropped and counted.
type pipeWriter struct {
	mu      sync.Mutex
	fd      int
	dropped atomic.Int64
}

// openLogPipe opens path read-write (so envd never gets EPIPE, and the
// kernel buffer keeps lines while the node's reader is away) and
// non-blocking. A missing pipe is (nil, nil).
func openLogPipe(path string) (*pipeWriter, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if fi.Mode()&os.ModeNamedPipe == 0 {
		return nil, nil
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &pipeWriter{fd: fd}, nil
}

// Write writes p, one slog record, as one pipe write; it never fails (a
// log line is not worth an error in the caller).
func (w *pipeWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > pipeLineMax {
		p = []byte(`{"level":"WARN","msg":"log line too long for the log pipe, dropped"}` + "\n")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		_, err := unix.Write(w.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			w.dropped.Add(1)
		}
		return n, nil
	}
}

// newLogger returns envd's logger: text on stderr (the sandbox's init log)
// and, when the node gave envd a log pipe, JSON lines into it.
func newLogger(pipePath string) *slog.Logger {
	stderr := slog.NewTextHandler(os.Stderr, nil)
	pw, err := openLogPipe(pipePath)
	if pw == nil {
		l := slog.New(stderr).With("component", "envd")
		if err != nil {
			l.Warn("sandbox log pipe unusable; logging to stderr only", "path", pipePath, "err", err)
		}
		return l
	}
	pipe := slog.NewJSONHandler(pw, &slog.HandlerOptions{ReplaceAttr: shortenAttr})
	return slog.New(slog.NewMultiHandler(stderr.WithAttrs([]slog.Attr{slog.String("component", "envd")}), pipe))
}

// maxAttrLen bounds a string attribute in a pipe line, so that lines stay
// under pipeLineMax.
const maxAttrLen = 512

func shortenAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindString {
		if s := a.Value.String(); len(s) > maxAttrLen {
			a.Value = slog.StringValue(s[:maxAttrLen] + "…")
		}
	}
	return a
}

// SetLogger makes s log what it does (process starts and ends) to l.
func (s *Server) SetLogger(l *slog.Logger) {
	s.process.SetLogger(l.With("logger", "process"))
}
