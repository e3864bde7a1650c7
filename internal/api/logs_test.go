package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/proxy"
	"github.com/cube-dev/cube/internal/sandboxlog"
)

// logNode is a listenNode that keeps sandbox logs in a real sandboxlog
// store, writing the lifecycle lines a cubelet writes.
type logNode struct {
	*listenNode
	logs *sandboxlog.Store
}

func (n *logNode) CreateSandbox(ctx context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error) {
	sb, err := n.listenNode.CreateSandbox(ctx, req)
	if err == nil {
		n.logs.Append(sb.ID, nodeproto.LogEntry{Level: "info", Logger: "cubelet", Message: "sandbox created", Fields: map[string]string{"template": req.Template}})
		n.logs.Append(sb.ID, nodeproto.LogEntry{Level: "info", Logger: "envd", Message: "envd listening"})
		n.logs.Append(sb.ID, nodeproto.LogEntry{Level: "warn", Logger: "process", Message: "process ended", Fields: map[string]string{"exitCode": "3"}})
	}
	return sb, err
}

func (n *logNode) KillSandbox(ctx context.Context, id string) error {
	err := n.listenNode.KillSandbox(ctx, id)
	if err == nil {
		r := nodeproto.KillReason(ctx)
		n.logs.Append(id, nodeproto.LogEntry{Level: "info", Logger: "cubelet", Message: "sandbox killed: " + r})
		n.logs.End(id, time.Now())
	}
	return err
}

func (n *logNode) SandboxLogs(_ context.Context, id string, q nodeproto.LogQuery) ([]nodeproto.LogEntry, error) {
	return n.logs.Read(id, q)
}

func newLogEnv(t *testing.T) *env {
	t.Helper()
	st, keys := openKeyStore(t, "test")
	logs, err := sandboxlog.Open(sandboxlog.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln := newListenNode()
	node := &logNode{listenNode: ln, logs: logs}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := master.New(st, node, master.Config{Domain: "cube.test", Logger: logger})
	srv := httptest.NewServer(proxy.New(m, New(m, st, logger), "cube.test"))
	t.Cleanup(func() {
		srv.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.Shutdown(sctx, true)
		ln.closeAll()
	})
	return &env{t: t, srv: srv, key: keys[0], node: ln, m: m, st: st}
}

type logsV1 struct {
	Logs []struct {
		Timestamp string `json:"timestamp"`
		Line      string `json:"line"`
	} `json:"logs"`
	LogEntries []logEntryJSON `json:"logEntries"`
}

func TestSandboxLogsV1AsTheCLIReadsThem(t *testing.T) {
	e := newLogEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	r := e.do("GET", "/sandboxes/"+sb.SandboxID+"/logs", "")
	if r.status != 200 {
		t.Fatalf("logs: %d %s", r.status, r.body)
	}
	var v1 logsV1
	r.json(t, &v1)
	if len(v1.Logs) != 3 || len(v1.LogEntries) != 3 {
		t.Fatalf("logs %s", r.body)
	}
	// `e2b sandbox logs` JSON.parses line and reads level and logger.
	var line map[string]string
	if err := json.Unmarshal([]byte(v1.Logs[2].Line), &line); err != nil {
		t.Fatalf("line %q is not a JSON object: %v", v1.Logs[2].Line, err)
	}
	if line["level"] != "warn" || line["logger"] != "process" || line["message"] != "process ended" || line["exitCode"] != "3" {
		t.Errorf("line %v", line)
	}
	ts, err := time.Parse(time.RFC3339, v1.Logs[2].Timestamp)
	if err != nil {
		t.Fatal(err)
	}
	if en := v1.LogEntries[0]; en.Message != "sandbox created" || en.Level != "info" || en.Fields["logger"] != "cubelet" || en.Fields["template"] != "base" {
		t.Errorf("logEntries[0] %+v", en)
	}
	// The CLI's --follow asks from the last line's time + 1 ms.
	r = e.do("GET", fmt.Sprintf("/sandboxes/%s/logs?start=%d", sb.SandboxID, ts.UnixMilli()+1), "")
	r.json(t, &v1)
	if r.status != 200 || len(v1.Logs) != 0 {
		t.Errorf("after the last line: %d %s", r.status, r.body)
	}
	r = e.do("GET", "/sandboxes/"+sb.SandboxID+"/logs?limit=1", "")
	r.json(t, &v1)
	if len(v1.Logs) != 1 {
		t.Errorf("limit=1: %s", r.body)
	}
	for _, bad := range []string{"?start=x", "?limit=-1"} {
		if r := e.do("GET", "/sandboxes/"+sb.SandboxID+"/logs"+bad, ""); r.status != 400 || r.errCode(t) != 400 {
			t.Errorf("%s: %d %s", bad, r.status, r.body)
		}
	}
	if r := e.do("GET", "/sandboxes/"+sb.SandboxID+"/logs", "", "X-API-Key", ""); r.status != 401 {
		t.Errorf("no key: %d", r.status)
	}
	for _, id := range []string{"iaaaaaaaaaaaaaaaaaaaa", "not-an-id"} {
		if r := e.do("GET", "/sandboxes/"+id+"/logs", ""); r.status != 404 || r.errCode(t) != 404 {
			t.Errorf("unknown %s: %d %s", id, r.status, r.body)
		}
	}
}

func TestSandboxLogsV2(t *testing.T) {
	e := newLogEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	get := func(q string) []logEntryJSON {
		t.Helper()
		r := e.do("GET", "/v2/sandboxes/"+sb.SandboxID+"/logs"+q, "")
		if r.status != 200 {
			t.Fatalf("%s: %d %s", q, r.status, r.body)
		}
		var v struct {
			Logs []logEntryJSON `json:"logs"`
		}
		r.json(t, &v)
		return v.Logs
	}
	msgs := func(es []logEntryJSON) string {
		var out []string
		for _, e := range es {
			out = append(out, e.Message)
		}
		return strings.Join(out, "|")
	}
	for q, want := range map[string]string{
		"":                             "sandbox created|envd listening|process ended",
		"?level=warn":                  "process ended",
		"?search=envd":                 "envd listening",
		"?direction=backward&limit=2":  "process ended|envd listening",
		"?direction=forward&limit=1":   "sandbox created",
		"?cursor=1&level=debug":        "sandbox created|envd listening|process ended",
		"?search=nothing+matches+this": "",
	} {
		if got := msgs(get(q)); got != want {
			t.Errorf("%s: %q, want %q", q, got, want)
		}
	}
	for _, bad := range []string{"?direction=up", "?level=fatal", "?cursor=-5", "?limit=x"} {
		if r := e.do("GET", "/v2/sandboxes/"+sb.SandboxID+"/logs"+bad, ""); r.status != 400 || r.errCode(t) != 400 {
			t.Errorf("%s: %d %s", bad, r.status, r.body)
		}
	}
}

// Logs outlive the sandbox, and say why it ended: a kill by request, or
// its timeout.
func TestSandboxLogsAfterTheEnd(t *testing.T) {
	e := newLogEnv(t)
	killed := e.create(`{"templateID":"base"}`)
	expired := e.create(`{"templateID":"base","timeout":1}`)
	if r := e.do("DELETE", "/sandboxes/"+killed.SandboxID, ""); r.status != 204 {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	last := func(id string) string {
		r := e.do("GET", "/v2/sandboxes/"+id+"/logs?direction=backward&limit=1", "")
		var v struct {
			Logs []logEntryJSON `json:"logs"`
		}
		if r.status != 200 {
			return fmt.Sprintf("%d %s", r.status, r.body)
		}
		r.json(t, &v)
		if len(v.Logs) == 0 {
			return ""
		}
		return v.Logs[0].Message
	}
	if r := e.do("GET", "/sandboxes/"+killed.SandboxID, ""); r.status != 404 {
		t.Fatalf("killed sandbox still there: %d", r.status)
	}
	if got := last(killed.SandboxID); got != "sandbox killed: "+nodeproto.KillReasonRequest {
		t.Errorf("killed sandbox's last line %q", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for last(expired.SandboxID) != "sandbox killed: "+nodeproto.KillReasonTimeout {
		if time.Now().After(deadline) {
			t.Fatalf("expired sandbox's last line %q", last(expired.SandboxID))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
