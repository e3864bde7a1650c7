package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/api/gen/envd/process/processconnect"
)

// sandbox is what the test knows of a sandbox it created.
type sandbox struct {
	ID    string `json:"sandboxID"`
	Token string `json:"envdAccessToken"`
	// tickPID is the pid of the long-running ticker started in it.
	tickPID  uint32
	lastTick int
}

// create asks the REST API for a sandbox of the base template.
func (n *node) create(ctx context.Context) (*sandbox, error) {
	body := strings.NewReader(`{"templateID":"base","timeout":3600}`)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.listen+"/sandboxes", body)
	req.Header.Set("X-API-Key", n.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := n.httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("create: %s: %s", resp.Status, b)
	}
	var sb sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// sandboxHeaders routes every envd request through cube-proxy.
type sandboxHeaders struct {
	next http.RoundTripper
	sb   *sandbox
}

func (h sandboxHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.sb.ID)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	r.Header.Set("X-Access-Token", h.sb.Token)
	return h.next.RoundTrip(r)
}

// envd returns a Connect client for the sandbox's process service, reached
// through the node's proxy.
func (n *node) envd(sb *sandbox) processconnect.ProcessClient {
	hc := &http.Client{Transport: sandboxHeaders{next: n.httpClient.Transport, sb: sb}}
	return processconnect.NewProcessClient(hc, "http://"+n.listen, connect.WithProtoJSON())
}

// run runs a shell command to completion and returns its stdout.
func (n *node) run(ctx context.Context, sb *sandbox, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := n.envd(sb).Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}},
	}))
	if err != nil {
		return "", err
	}
	defer stream.Close()
	var out bytes.Buffer
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out.Write(ev.GetData().GetStdout())
		if end := ev.GetEnd(); end != nil {
			if end.GetExitCode() != 0 {
				return out.String(), fmt.Errorf("exit %d: %s", end.GetExitCode(), end.GetError())
			}
			return out.String(), nil
		}
	}
	return out.String(), fmt.Errorf("stream ended without end event: %w", stream.Err())
}

// tickScript prints "tick-N" every 100 ms forever.
const tickScript = `i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.1; done`

// startTicker starts the long-running command and detaches once it has
// printed its first line (the process outlives the stream).
func (n *node) startTicker(ctx context.Context, sb *sandbox) error {
	ctx, cancel := context.WithCancel(ctx) // no deadline: it would bound the process's life
	defer cancel()
	stream, err := n.envd(sb).Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", tickScript}},
		Tag:     ptr("ticker"),
	}))
	if err != nil {
		return err
	}
	defer stream.Close()
	timer := time.AfterFunc(30*time.Second, cancel)
	defer timer.Stop()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if s := ev.GetStart(); s != nil {
			sb.tickPID = s.GetPid()
		}
		if t, ok := lastTick(ev.GetData().GetStdout()); ok {
			sb.lastTick = t
			return nil
		}
	}
	return fmt.Errorf("ticker: no output: %w", stream.Err())
}

// tickerProgress attaches to the ticker with process.Process/Connect and
// waits for a tick later than the last one seen, proving the command kept
// running; it updates sb.lastTick.
func (n *node) tickerProgress(ctx context.Context, sb *sandbox) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	timer := time.AfterFunc(30*time.Second, cancel)
	defer timer.Stop()
	stream, err := n.envd(sb).Connect(ctx, connect.NewRequest(&pb.ConnectRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: sb.tickPID}},
	}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if ev.GetEnd() != nil {
			return errors.New("ticker ended")
		}
		if t, ok := lastTick(ev.GetData().GetStdout()); ok && t > sb.lastTick {
			sb.lastTick = t
			return nil
		}
	}
	return fmt.Errorf("connect to ticker %d: %w", sb.tickPID, stream.Err())
}

func lastTick(b []byte) (int, bool) {
	lines := strings.Fields(string(b))
	for i := len(lines) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(lines[i], "tick-"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n, true
			}
		}
	}
	return 0, false
}

func ptr[T any](v T) *T { return &v }

// mapdump runs `cube node mapdump --json` and decodes it.
func (n *node) mapdump() (mapdumpDoc, string) {
	n.t.Helper()
	out, code := n.cubeCLI("node", "mapdump", "--json")
	if code != 0 {
		n.t.Fatalf("cube node mapdump: exit %d\n%s", code, out)
	}
	var doc mapdumpDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		n.t.Fatalf("mapdump output: %v\n%s", err, out)
	}
	return doc, out
}

type mapdumpDoc struct {
	Source   string `json:"source"`
	Mappings []struct {
		HostPort  uint16 `json:"hostPort"`
		GuestPort uint16 `json:"guestPort"`
		Owner     string `json:"owner"`
		Status    string `json:"status"`
	} `json:"mappings"`
}

// statuses counts mappings by status, and owned mappings by owner.
func (d mapdumpDoc) statuses() (map[string]int, map[string]int) {
	by, owners := map[string]int{}, map[string]int{}
	for _, m := range d.Mappings {
		by[m.Status]++
		if m.Status == "owned" {
			owners[m.Owner]++
		}
	}
	return by, owners
}

// orphanLines is what an operator's `grep -ci orphan` prints.
func orphanLines(out string) int {
	n := 0
	for _, l := range strings.Split(strings.ToLower(out), "\n") {
		if strings.Contains(l, "orphan") {
			n++
		}
	}
	return n
}
