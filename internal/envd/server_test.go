package envd_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/cube-dev/cube/api/gen/envd/filesystem"
	"github.com/cube-dev/cube/api/gen/envd/filesystem/filesystemconnect"
	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/api/gen/envd/process/processconnect"
	"github.com/cube-dev/cube/internal/envd"
)

func TestAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envd.Config) { c.AccessToken = "tok-123" })
	ctx := testCtx(t, 20*time.Second)

	// /health needs no token.
	resp, err := http.Get(e.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health: %d", resp.StatusCode)
	}

	// Clients without (or with a wrong) token.
	for _, tok := range []string{"", "wrong", "tok-1234"} {
		opts := []connect.ClientOption{connect.WithProtoJSON(), connect.WithInterceptors(tokenInterceptor(tok))}
		pc := processconnect.NewProcessClient(http.DefaultClient, e.url, opts...)
		fc := filesystemconnect.NewFilesystemClient(http.DefaultClient, e.url, opts...)
		_, err := pc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
		wantCode(t, err, connect.CodeUnauthenticated)
		s, err := pc.Start(ctx, connect.NewRequest(startCmd("true")))
		if err == nil {
			if s.Receive() {
				t.Fatalf("token %q: got event %v", tok, s.Msg())
			}
			err = s.Err()
		}
		wantCode(t, err, connect.CodeUnauthenticated)
		_, err = fc.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "/"}))
		wantCode(t, err, connect.CodeUnauthenticated)
		for _, r := range []struct{ method, path string }{{"GET", "/files?path=x"}, {"POST", "/files?path=x"}, {"GET", "/envs"}, {"POST", "/init"}} {
			req, _ := http.NewRequest(r.method, e.url+r.path, strings.NewReader("{}"))
			if tok != "" {
				req.Header.Set("X-Access-Token", tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s %s with token %q: %d", r.method, r.path, tok, resp.StatusCode)
			}
		}
	}
	// The right token works.
	if _, err := e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{})); err != nil {
		t.Fatal(err)
	}
}

func TestInitAndEnvs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	post := func(body string, token string) int {
		req, _ := http.NewRequest("POST", e.url+"/init", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post(`{"envVars":{"FROM_INIT":"1"},"defaultUser":"tester","timestamp":"2026-01-02T00:00:00Z"}`, ""); got != http.StatusNoContent {
		t.Fatalf("init: %d", got)
	}
	// An older init is ignored.
	if got := post(`{"envVars":{"FROM_INIT":"old"},"defaultUser":"root","timestamp":"2026-01-01T00:00:00Z"}`, ""); got != http.StatusNoContent {
		t.Fatalf("old init: %d", got)
	}
	if got := post(`{"envVars":`, ""); got != http.StatusBadRequest {
		t.Fatalf("bad init: %d", got)
	}
	if got := post(`{"envVars":{"A=B":"x"}}`, ""); got != http.StatusBadRequest {
		t.Fatalf("bad env init: %d", got)
	}
	resp, err := http.Get(e.url + "/envs")
	if err != nil {
		t.Fatal(err)
	}
	var envs map[string]string
	json.NewDecoder(resp.Body).Decode(&envs)
	resp.Body.Close()
	if envs["FROM_INIT"] != "1" || envs["SANDBOX_VAR"] != "sbx" {
		t.Fatalf("envs = %v", envs)
	}
	// The default user changed to tester; the env var reaches processes.
	s, err := e.proc.Start(ctx, connect.NewRequest(startCmd(`echo "$(id -u) $FROM_INIT"`)))
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); strings.TrimSpace(string(r.stdout)) != "1000 1" {
		t.Fatalf("after init: %q %q", r.stdout, r.stderr)
	}
	// Setting a token through /init protects the server from then on.
	if got := post(`{"accessToken":"new-token"}`, ""); got != http.StatusNoContent {
		t.Fatalf("init token: %d", got)
	}
	_, err = e.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	wantCode(t, err, connect.CodeUnauthenticated)
	if got := post(`{}`, "new-token"); got != http.StatusNoContent {
		t.Fatalf("init with token: %d", got)
	}
}

// envelope frames one Connect streaming message.
func envelope(flags byte, payload []byte) []byte {
	b := make([]byte, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:5], uint32(len(payload)))
	copy(b[5:], payload)
	return b
}

// TestWireFormat speaks the Connect protocol the way the JS SDK does:
// enveloped JSON request, Connect-Timeout-Ms as the process lifetime.
func TestWireFormat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	body := envelope(0, []byte(`{"process":{"cmd":"/bin/sh","args":["-c","echo hi; exec sleep 30"]},"stdin":false}`))
	req, _ := http.NewRequest("POST", e.url+"/process.Process/Start", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", "600")
	req.Header.Set("Keepalive-Ping-Interval", "50")
	client := &http.Client{Timeout: 15 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	var flags []byte
	for len(raw) >= 5 {
		n := binary.BigEndian.Uint32(raw[1:5])
		flags = append(flags, raw[0])
		msgs = append(msgs, string(raw[5:5+n]))
		raw = raw[5+n:]
	}
	if len(msgs) != 4 {
		t.Fatalf("messages %q", msgs)
	}
	// protojson varies whitespace on purpose: compare parsed JSON.
	var start struct {
		Event struct{ Start struct{ Pid int } }
	}
	if err := json.Unmarshal([]byte(msgs[0]), &start); err != nil || start.Event.Start.Pid == 0 || flags[0] != 0 {
		t.Errorf("first %s", msgs[0])
	}
	jsonEqual(t, msgs[1], `{"event":{"data":{"stdout":"aGkK"}}}`)
	jsonEqual(t, msgs[2], `{"event":{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}}`)
	if flags[3] != 2 {
		t.Errorf("end of stream flags %d", flags[3])
	}
	jsonEqual(t, msgs[3], `{}`)

	// Unary JSON error shape.
	req, _ = http.NewRequest("POST", e.url+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/no/such/path"}`))
	req.Header.Set("Content-Type", "application/json")
	resp2, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	var cerr struct{ Code, Message string }
	json.NewDecoder(resp2.Body).Decode(&cerr)
	if resp2.StatusCode != 404 || cerr.Code != "not_found" {
		t.Fatalf("stat missing: %d %+v", resp2.StatusCode, cerr)
	}
	// Malformed JSON is invalid_argument, never a 500.
	for _, b := range []string{`{"path":`, `{"path":5}`, `[]`} {
		req, _ = http.NewRequest("POST", e.url+"/filesystem.Filesystem/ListDir", strings.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		r, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode >= 500 || r.StatusCode < 400 {
			t.Errorf("body %s: status %d", b, r.StatusCode)
		}
	}
}

func jsonEqual(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("bad JSON %s: %v", got, err)
	}
	json.Unmarshal([]byte(want), &w)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("got %s, want %s", got, want)
	}
}

// TestInitHandsOverToken is the warm pool's take: envd started with a
// slot's own token is configured through /init (authenticated with that
// token) with the sandbox's token and env vars; from then on only the
// sandbox's token works and processes see the env vars. An empty token
// leaves envd open, as a sandbox created without one.
func TestInitHandsOverToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envd.Config) { c.AccessToken = "slot-token"; c.EnvVars = nil })
	ctx := testCtx(t, 20*time.Second)
	call := func(method, path, body, token string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, e.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if got, _ := call("POST", "/init", `{"accessToken":"sbx-token","envVars":{"FROM_TAKE":"1"}}`, ""); got != http.StatusUnauthorized {
		t.Fatalf("init without the slot token: %d", got)
	}
	if got, _ := call("POST", "/init", `{"accessToken":"sbx-token","envVars":{"FROM_TAKE":"1"}}`, "slot-token"); got != http.StatusNoContent {
		t.Fatalf("init with the slot token: %d", got)
	}
	for _, tok := range []string{"", "slot-token"} {
		if got, _ := call("GET", "/envs", "", tok); got != http.StatusUnauthorized {
			t.Errorf("envs with token %q after take: %d", tok, got)
		}
		if got, _ := call("POST", "/init", `{"accessToken":""}`, tok); got != http.StatusUnauthorized {
			t.Errorf("init with token %q after take: %d", tok, got)
		}
	}
	got, body := call("GET", "/envs", "", "sbx-token")
	var envs map[string]string
	if got != http.StatusOK || json.Unmarshal(body, &envs) != nil || !reflect.DeepEqual(envs, map[string]string{"FROM_TAKE": "1"}) {
		t.Fatalf("envs with the sandbox token: %d %s", got, body)
	}
	pc := processconnect.NewProcessClient(http.DefaultClient, e.url, connect.WithProtoJSON(), connect.WithInterceptors(tokenInterceptor("sbx-token")))
	s, err := pc.Start(ctx, connect.NewRequest(startCmd(`echo "$FROM_TAKE"`)))
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, s); strings.TrimSpace(string(r.stdout)) != "1" {
		t.Fatalf("process env after take: %q %q", r.stdout, r.stderr)
	}
	// A sandbox created without a token: /init opens envd.
	if got, _ := call("POST", "/init", `{"accessToken":""}`, "sbx-token"); got != http.StatusNoContent {
		t.Fatalf("init to no token: %d", got)
	}
	if got, _ := call("GET", "/envs", "", ""); got != http.StatusOK {
		t.Fatalf("envs without token after opening: %d", got)
	}
}
