package nodeproto

import (
	"context"
	"time"
)

// LogEntry is one line of a sandbox's log as a node keeps it: envd's own
// lines (logger envd, process, filesystem) and the node's lifecycle lines
// for the sandbox (logger cubelet).
type LogEntry struct {
	Time    time.Time
	Level   string // debug, info, warn, error
	Logger  string
	Message string
	Fields  map[string]string
}

// LogQuery selects lines of a sandbox's log.
type LogQuery struct {
	// Cursor is a time in the log: forward returns lines at or after it
	// (oldest first), Backward lines at or before it (newest first). Zero:
	// from the first line, or back from the last.
	Cursor   time.Time
	Backward bool
	Limit    int    // 0: DefaultLogLimit; capped at MaxLogLimit
	MinLevel string // "" or debug: everything
	Search   string // case-sensitive substring of the message
}

// Log query limits, the E2B API's default and a cap that bounds one answer.
const (
	DefaultLogLimit = 1000
	MaxLogLimit     = 10000
)

// Log levels, lowest first.
var logLevels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// ValidLogLevel reports whether l is a level a query may name ("" is).
func ValidLogLevel(l string) bool {
	_, ok := logLevels[l]
	return ok || l == ""
}

// LogLevelAtLeast reports whether level is min or above; unknown levels
// count as info.
func LogLevelAtLeast(level, min string) bool {
	lv, ok := logLevels[level]
	if !ok {
		lv = 1
	}
	return lv >= logLevels[min]
}

// Why a sandbox is killed, as its lifecycle log line says it.
const (
	KillReasonRequest = "killed by request"
	KillReasonTimeout = "timeout reached"
)

type killReasonKey struct{}

// WithKillReason tells the node, through a KillSandbox call made with the
// returned context, why the sandbox is killed (the node API carries it in a
// request header). Without it the node logs KillReasonRequest.
func WithKillReason(ctx context.Context, reason string) context.Context {
	return context.WithValue(ctx, killReasonKey{}, reason)
}

// KillReason returns what WithKillReason put in ctx, or "".
func KillReason(ctx context.Context) string {
	r, _ := ctx.Value(killReasonKey{}).(string)
	return r
}
