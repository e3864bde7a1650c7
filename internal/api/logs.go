package api

import (
	"encoding/json"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/cube-dev/cube/internal/nodeproto"
)

// logEntryJSON is the E2B API's SandboxLogEntry.
type logEntryJSON struct {
	Timestamp string            `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logLineJSON is the E2B API's SandboxLog (v1): line is a JSON object, as
// `e2b sandbox logs` parses it (level and logger are read, the rest is
// printed).
type logLineJSON struct {
	Timestamp string `json:"timestamp"`
	Line      string `json:"line"`
}

// logTimeFormat is RFC 3339 with milliseconds: clients page by the last
// line's time + 1 ms.
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

func toLogEntry(e nodeproto.LogEntry) logEntryJSON {
	fields := map[string]string{}
	maps.Copy(fields, e.Fields)
	if e.Logger != "" {
		fields["logger"] = e.Logger
	}
	return logEntryJSON{Timestamp: e.Time.UTC().Format(logTimeFormat), Level: e.Level, Message: e.Message, Fields: fields}
}

func toLogLine(e nodeproto.LogEntry) logLineJSON {
	obj := make(map[string]string, len(e.Fields)+3)
	maps.Copy(obj, e.Fields)
	obj["level"], obj["logger"], obj["message"] = e.Level, e.Logger, e.Message
	b, _ := json.Marshal(obj) // a map of strings: cannot fail
	return logLineJSON{Timestamp: e.Time.UTC().Format(logTimeFormat), Line: string(b)}
}

// queryInt reads an optional non-negative integer query parameter.
func queryInt(r *http.Request, name string) (int64, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n >= 0
}

// logsV1 serves GET /sandboxes/{sandboxID}/logs?start=&limit= (start in
// unix milliseconds): lines at or after start, oldest first, as both
// `logs` (what `e2b sandbox logs` reads) and `logEntries`.
func (s *server) logsV1(w http.ResponseWriter, r *http.Request) {
	start, ok1 := queryInt(r, "start")
	limit, ok2 := queryInt(r, "limit")
	if !ok1 || !ok2 {
		writeErrorMessage(w, http.StatusBadRequest, "start (unix milliseconds) and limit must be non-negative integers")
		return
	}
	q := nodeproto.LogQuery{Limit: int(min(limit, nodeproto.MaxLogLimit))}
	if start > 0 {
		q.Cursor = time.UnixMilli(start)
	}
	entries, err := s.m.Logs(r.Context(), r.PathValue("sandboxID"), q)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := struct {
		Logs       []logLineJSON  `json:"logs"`
		LogEntries []logEntryJSON `json:"logEntries"`
	}{Logs: make([]logLineJSON, 0, len(entries)), LogEntries: make([]logEntryJSON, 0, len(entries))}
	for _, e := range entries {
		out.Logs = append(out.Logs, toLogLine(e))
		out.LogEntries = append(out.LogEntries, toLogEntry(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// logsV2 serves GET /v2/sandboxes/{sandboxID}/logs?cursor=&direction=&level=&limit=&search=:
// forward (default) returns lines at or after cursor oldest first,
// backward lines at or before cursor (default: now) newest first.
func (s *server) logsV2(w http.ResponseWriter, r *http.Request) {
	qs := r.URL.Query()
	cursor, ok1 := queryInt(r, "cursor")
	limit, ok2 := queryInt(r, "limit")
	if !ok1 || !ok2 {
		writeErrorMessage(w, http.StatusBadRequest, "cursor (unix milliseconds) and limit must be non-negative integers")
		return
	}
	q := nodeproto.LogQuery{Limit: int(min(limit, nodeproto.MaxLogLimit)), MinLevel: qs.Get("level"), Search: qs.Get("search")}
	switch qs.Get("direction") {
	case "", "forward":
	case "backward":
		q.Backward = true
	default:
		writeErrorMessage(w, http.StatusBadRequest, "direction must be forward or backward")
		return
	}
	if !nodeproto.ValidLogLevel(q.MinLevel) {
		writeErrorMessage(w, http.StatusBadRequest, "level must be debug, info, warn or error")
		return
	}
	if cursor > 0 {
		q.Cursor = time.UnixMilli(cursor)
	}
	entries, err := s.m.Logs(r.Context(), r.PathValue("sandboxID"), q)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := struct {
		Logs []logEntryJSON `json:"logs"`
	}{Logs: make([]logEntryJSON, 0, len(entries))}
	for _, e := range entries {
		out.Logs = append(out.Logs, toLogEntry(e))
	}
	writeJSON(w, http.StatusOK, out)
}
