package api

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// End-to-end proxy tests: API and proxy on one h2c-capable listener, the
// sandboxes are real HTTP servers started by listenNode.

func TestProxyByHeaderAndHost(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	// Header routing; Authorization and X-Access-Token pass through untouched.
	r := e.do("GET", "/whoami", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49983",
		"X-API-Key", "", "Authorization", "Basic cm9vdDo=", "X-Access-Token", sb.EnvdAccessToken)
	if r.status != 200 || string(r.body) != sb.SandboxID+"|Basic cm9vdDo=|"+sb.EnvdAccessToken {
		t.Fatalf("header route: %d %s", r.status, r.body)
	}
	// Host routing, with a :port suffix and mixed case.
	req, _ := http.NewRequest("GET", e.srv.URL+"/whoami", nil)
	req.Host = "49983-" + sb.SandboxID + ".CUBE.test:3000"
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(string(b), sb.SandboxID+"|") {
		t.Fatalf("host route: %d %s", res.StatusCode, b)
	}
	// Unknown sandbox: 502 JSON with the exact message.
	r = e.do("GET", "/health", "", "E2b-Sandbox-Id", "unknownunknownunkno1")
	if r.status != 502 || string(bytes.TrimSpace(r.body)) != `{"code":502,"message":"sandbox unknownunknownunkno1 is not running"}` {
		t.Fatalf("unknown sandbox: %d %s", r.status, r.body)
	}
	// Running, but nothing listens on that port.
	if r := e.do("GET", "/", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "1"); r.status != 502 || r.errCode(t) != 502 {
		t.Fatalf("closed port: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "70000"); r.status != 400 {
		t.Fatalf("bad port header: %d %s", r.status, r.body)
	}
	// After kill the cached address is dropped: 502.
	e.do("DELETE", "/sandboxes/"+sb.SandboxID, "")
	if r := e.do("GET", "/health", "", "E2b-Sandbox-Id", sb.SandboxID); r.status != 502 {
		t.Fatalf("after kill: %d %s", r.status, r.body)
	}
}

func TestProxyStreamsAndUploads(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	req, _ := http.NewRequest("GET", e.srv.URL+"/stream", nil)
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	// The upstream handler is still blocked: the chunk arrived unbuffered.
	close(e.node.release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "second\n" {
		t.Fatalf("rest: %q", rest)
	}

	payload := make([]byte, 10<<20)
	rand.Read(payload)
	sum := sha256.Sum256(payload)
	req, _ = http.NewRequest("POST", e.srv.URL+"/upload", bytes.NewReader(payload))
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	res2, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res2.Body)
	res2.Body.Close()
	if want := fmt.Sprintf("%d %s", len(payload), hex.EncodeToString(sum[:])); string(b) != want {
		t.Fatalf("upload: %q want %q", b, want)
	}
}

func TestH2CListener(t *testing.T) {
	e := newEnv(t)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: &p}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", e.srv.URL+"/v2/sandboxes", nil)
	req.Header.Set("X-API-Key", e.key)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.ProtoMajor != 2 {
		t.Fatalf("h2c: %d %s", res.StatusCode, res.Proto)
	}
}

// TestTrafficAccessToken: with network.allowPublicTraffic=false the create
// returns a traffic access token, and non-envd ports answer only requests
// carrying it; envd's port keeps its own token scheme.
func TestTrafficAccessToken(t *testing.T) {
	e := newEnv(t)
	var sb struct {
		SandboxID          string  `json:"sandboxID"`
		TrafficAccessToken *string `json:"trafficAccessToken"`
	}
	r := e.do("POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":false}}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r.json(t, &sb)
	if sb.TrafficAccessToken == nil || len(*sb.TrafficAccessToken) < 32 {
		t.Fatalf("no traffic access token: %s", r.body)
	}
	if r := e.do("GET", "/whoami", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8080"); r.status != http.StatusForbidden || r.errCode(t) != 403 {
		t.Fatalf("without token: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/whoami", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8080", "E2b-Traffic-Access-Token", "wrong"); r.status != http.StatusForbidden {
		t.Fatalf("wrong token: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/whoami", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8080", "E2b-Traffic-Access-Token", *sb.TrafficAccessToken); r.status != 200 {
		t.Fatalf("with token: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/whoami", "", "E2b-Sandbox-Id", sb.SandboxID); r.status != 200 {
		t.Fatalf("envd port needs no traffic token: %d %s", r.status, r.body)
	}
	// Public sandboxes: null token, any port open.
	r = e.do("POST", "/v2/sandboxes", `{"templateID":"base"}`)
	r.json(t, &sb)
	if sb.TrafficAccessToken != nil {
		t.Fatalf("public sandbox got a traffic token: %s", r.body)
	}
	if r := e.do("GET", "/whoami", "", "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8080"); r.status != 200 {
		t.Fatalf("public port: %d %s", r.status, r.body)
	}
}
