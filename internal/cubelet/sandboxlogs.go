package cubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/sandboxlog"
	"github.com/cube-dev/cube/internal/supervisor"
)

// Sandbox logs (docs/observability.md): envd's lines come through a FIFO
// in the sandbox's state dir (sandboxlog.PipeFile, bound at
// sandboxlog.PipeTarget), drained by a follower per running sandbox; the
// cubelet adds its own lifecycle lines (created, paused, resumed, killed,
// died). Both go to the store under <state dir>/sandbox-logs, which
// outlives the sandbox (and is not in its state dir, which goes with it)
// for the retention.

// LogConfig bounds the sandbox logs a node keeps.
type LogConfig struct {
	MaxBytes      int64         // per sandbox (0: sandboxlog.DefaultMaxBytes)
	Retention     time.Duration // after a sandbox ended (0: sandboxlog.DefaultRetention)
	MaxEndedBytes int64         // all ended sandboxes (0: sandboxlog.DefaultMaxEndedBytes)
}

// logGCInterval is how often expired logs are removed.
const logGCInterval = 10 * time.Minute

// logDrainGrace is how long a stopping follower still reads what the
// sandbox wrote last.
const logDrainGrace = 200 * time.Millisecond

// logLogger is the logger name of the cubelet's lifecycle lines.
const logLogger = "cubelet"

// sandboxLogs is the cubelet's part: the store and the followers.
type sandboxLogs struct {
	store *sandboxlog.Store
	mu    sync.Mutex
	fol   map[string]*sandboxlog.Follower // sandbox id -> its pipe's follower
	stop  chan struct{}
	done  chan struct{}
}

// LogsDir is where a node keeps sandbox logs, under its state dir.
func LogsDir(stateDir string) string { return filepath.Join(stateDir, "sandbox-logs") }

// startLogs opens the log store, follows the pipes of the running
// sandboxes (after a restart: those Reconcile kept) and starts the GC loop.
// A store that cannot be opened costs the logs, never the node.
func (c *Cubelet) startLogs() {
	st, err := sandboxlog.Open(sandboxlog.Config{Dir: LogsDir(c.cfg.StateDir), MaxBytes: c.cfg.Logs.MaxBytes,
		Retention: c.cfg.Logs.Retention, MaxEndedBytes: c.cfg.Logs.MaxEndedBytes})
	if err != nil {
		c.log.Error("sandbox logs disabled", "err", err)
		return
	}
	l := &sandboxLogs{store: st, fol: map[string]*sandboxlog.Follower{}, stop: make(chan struct{}), done: make(chan struct{})}
	c.logs = l
	recs, _ := c.store.List()
	for _, r := range recs {
		if r.State == nodestore.StateRunning {
			c.followLogs(r)
		}
	}
	go c.logGC(l)
}

// stopLogs stops the followers (lines left in the pipes wait for the next
// start) and the GC loop.
func (c *Cubelet) stopLogs() {
	l := c.logs
	if l == nil {
		return
	}
	close(l.stop)
	<-l.done
	l.mu.Lock()
	fol := l.fol
	l.fol = map[string]*sandboxlog.Follower{}
	l.mu.Unlock()
	for _, f := range fol {
		f.Stop(0)
	}
}

func (c *Cubelet) logGC(l *sandboxLogs) {
	defer close(l.done)
	t := time.NewTicker(logGCInterval)
	defer t.Stop()
	for {
		c.gcLogs()
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
	}
}

// gcLogs removes logs past the retention; a log whose sandbox the node no
// longer has (it ended while no cubelet ran) is marked ended first.
func (c *Cubelet) gcLogs() {
	if c.logs == nil {
		return
	}
	live := func(id string) bool {
		_, err := c.store.Get(id)
		return err == nil
	}
	rep, err := c.logs.store.GC(time.Now(), live)
	if err != nil {
		c.log.Warn("sandbox logs gc", "err", err)
	}
	if rep != (sandboxlog.GCReport{}) {
		c.log.Info("sandbox logs gc", "expired", rep.Expired, "evicted", rep.Evicted, "markedEnded", rep.MarkedEnd)
	}
}

// withLogPipe makes the sandbox's log FIFO in its state dir and binds it
// where envd looks for it. Without it envd logs to stderr only: a create
// never fails for its logs.
func (c *Cubelet) withLogPipe(stateDir string, binds []nsrt.Bind) []nsrt.Bind {
	p := filepath.Join(stateDir, sandboxlog.PipeFile)
	if err := sandboxlog.MakePipe(p); err != nil {
		c.log.Warn("sandbox log pipe", "stateDir", stateDir, "err", err)
		return binds
	}
	return append(binds, nsrt.Bind{Source: p, Target: sandboxlog.PipeTarget})
}

// followLogs starts draining the log pipe of a running sandbox (none for
// sandboxes started by a version without pipes).
func (c *Cubelet) followLogs(rec nodestore.Sandbox) {
	l := c.logs
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fol[rec.ID] != nil {
		return
	}
	p := filepath.Join(c.sandboxDir(rec.Runtime()), sandboxlog.PipeFile)
	if _, err := os.Lstat(p); err != nil {
		return
	}
	id := rec.ID
	f, err := l.store.Follow(id, p, func(err error) { c.log.Debug("sandbox log line lost", "sandbox", id, "err", err) })
	if err != nil {
		c.log.Warn("follow sandbox log pipe", "sandbox", id, "err", err)
		return
	}
	l.fol[id] = f
}

// unfollowLogs stops the follower of sandbox id after reading what is left.
func (c *Cubelet) unfollowLogs(id string) {
	l := c.logs
	if l == nil {
		return
	}
	l.mu.Lock()
	f := l.fol[id]
	delete(l.fol, id)
	l.mu.Unlock()
	if f != nil {
		f.Stop(logDrainGrace)
	}
}

// logEvent adds a lifecycle line to the log of sandbox id.
func (c *Cubelet) logEvent(id, level, msg string, fields map[string]string) {
	if c.logs == nil {
		return
	}
	e := nodeproto.LogEntry{Time: time.Now(), Level: level, Logger: logLogger, Message: msg, Fields: fields}
	if err := c.logs.store.Append(id, e); err != nil {
		c.log.Warn("sandbox log", "sandbox", id, "err", err)
	}
}

// logCreated records a create and starts following the sandbox's pipe.
func (c *Cubelet) logCreated(rec nodestore.Sandbox, path string) {
	c.logEvent(rec.ID, "info", "sandbox created", map[string]string{
		"template": rec.Template, "path": path, "cpuCount": strconv.Itoa(rec.CPUCount), "memoryMB": strconv.Itoa(rec.MemoryMB),
	})
	c.followLogs(rec)
}

// logEnded records why a sandbox is being torn down, after draining its
// pipe, and marks its log ended. It runs before the state dir goes: the
// supervisor's exit record (exit.json) and envd's stderr (init.log) say
// how a sandbox that died on its own ended.
func (c *Cubelet) logEnded(ctx context.Context, rec nodestore.Sandbox) {
	if c.logs == nil || isSlot(rec.ID) {
		return
	}
	dir := filepath.Join(LogsDir(c.cfg.StateDir), rec.ID)
	if _, err := os.Stat(dir); err != nil && rec.State != nodestore.StateRunning {
		return // a create that failed, or a slot: it never ran as a sandbox
	}
	if _, err := os.Stat(filepath.Join(dir, "ended")); err == nil {
		return // a retried teardown
	}
	c.unfollowLogs(rec.ID)
	level, msg, fields := c.endOf(ctx, rec)
	c.logEvent(rec.ID, level, msg, fields)
	if err := c.logs.store.End(rec.ID, time.Now()); err != nil {
		c.log.Warn("sandbox log end", "sandbox", rec.ID, "err", err)
	}
}

// Kill reasons the node itself gives.
const (
	reasonDied    = "its supervisor is gone"
	reasonRemoved = "removed by the node"
)

// endOf says how a sandbox ended, from most to least telling: its init
// exited on its own (exit.json), its supervisor vanished, or it was
// killed (with the reason the kill carried).
func (c *Cubelet) endOf(ctx context.Context, rec nodestore.Sandbox) (level, msg string, fields map[string]string) {
	dir := c.sandboxDir(rec.Runtime())
	reason := nodeproto.KillReason(ctx)
	if ex, ok := readExit(dir); ok {
		fields = map[string]string{"exitCode": strconv.Itoa(ex.ExitCode), "exitedAt": ex.ExitedAt.UTC().Format(time.RFC3339Nano)}
		what := "exit code " + strconv.Itoa(ex.ExitCode)
		if sig := unix.Signal(ex.ExitCode - 128); ex.ExitCode > 128 && unix.SignalName(sig) != "" {
			// pid 1 (cube-reaper) ends with 128+N when envd was killed by signal N.
			what += " (envd killed by " + unix.SignalName(sig) + ")"
		}
		if ex.Signal != "" {
			fields["signal"] = ex.Signal
			what = "signal " + ex.Signal
		}
		if tail := initLogTail(dir, 1024); tail != "" {
			fields["initLog"] = tail
		}
		if reason != "" {
			fields["then"] = reason
		}
		return "error", "sandbox died unexpectedly: its init (envd) ended with " + what, fields
	}
	switch reason {
	case reasonDied:
		return "error", "sandbox died unexpectedly: its supervisor process is gone (killed from outside?)", nil
	case "":
		reason = reasonRemoved
	}
	return "info", "sandbox killed: " + reason, map[string]string{"reason": reason}
}

// readExit reads the supervisor's exit record of a sandbox.
func readExit(dir string) (supervisor.ExitStatus, bool) {
	b, err := os.ReadFile(filepath.Join(dir, supervisor.ExitFile))
	if err != nil {
		return supervisor.ExitStatus{}, false
	}
	var ex supervisor.ExitStatus
	if json.Unmarshal(b, &ex) != nil {
		return supervisor.ExitStatus{}, false
	}
	return ex, true
}

// initLogTail returns the last n bytes of the sandbox's init log (its pid
// 1's and envd's stderr), from the start of a line.
func initLogTail(dir string, n int64) string {
	s, cut := nsrt.InitLogTail(dir, n)
	if cut {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return strings.ToValidUTF8(strings.TrimSpace(s), "?")
}

// logPaused records a pause or resume.
func (c *Cubelet) logPaused(id string, paused bool) {
	if paused {
		c.logEvent(id, "info", "sandbox paused", nil)
		return
	}
	c.logEvent(id, "info", "sandbox resumed", nil)
}

// SandboxLogs returns lines of the log of sandbox id: a running one, or
// one that ended within the retention. Unknown: errdefs.ErrNotFound.
func (c *Cubelet) SandboxLogs(_ context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error) {
	if c.logs == nil {
		return nil, fmt.Errorf("sandbox logs are disabled on this node (see its start-up log): %w", errdefs.ErrNotImplemented)
	}
	return c.logs.store.Read(id, q)
}
