package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/proxy"
	"github.com/cube-dev/cube/internal/store"
)

type env struct {
	t    *testing.T
	srv  *httptest.Server
	key  string
	node *listenNode
	m    *master.Master
	st   *store.SQLite
}

// openKeyStore opens a server store in a temporary dir, closed after the
// test's other cleanups, and creates an API key for each name.
func openKeyStore(t *testing.T, names ...string) (*store.SQLite, []string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	keys := make([]string, len(names))
	for i, name := range names {
		if keys[i], err = st.CreateKey(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	return st, keys
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	st, keys := openKeyStore(t, "test")
	key := keys[0]
	node := newListenNode()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := master.New(st, node, master.Config{Domain: "cube.test", Logger: logger})
	h := proxy.New(m, New(m, st, logger), "cube.test")
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = proxy.Protocols()
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := m.Shutdown(sctx, true); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		node.closeAll()
	})
	return &env{t: t, srv: srv, key: key, node: node, m: m, st: st}
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %q: %v", r.body, err)
	}
}

// errCode returns the numeric code of a JSON error body (-1 if none).
func (r resp) errCode(t *testing.T) int {
	t.Helper()
	var e struct {
		Code    *int   `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(r.body, &e) != nil || e.Code == nil || e.Message == "" {
		t.Fatalf("not a JSON error body: %q", r.body)
	}
	return *e.Code
}

func (e *env) do(method, path string, body string, hdr ...string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", e.key)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func (e *env) create(body string) sandboxJSON {
	e.t.Helper()
	r := e.do("POST", "/v2/sandboxes", body)
	if r.status != http.StatusCreated {
		e.t.Fatalf("create: %d %s", r.status, r.body)
	}
	var sb sandboxJSON
	r.json(e.t, &sb)
	return sb
}

func TestHealthNeedsNoAuth(t *testing.T) {
	e := newEnv(t)
	r := e.do("GET", "/health", "", "X-API-Key", "")
	if r.status != 200 || !strings.Contains(string(r.body), `"ok"`) {
		t.Fatalf("health: %d %s", r.status, r.body)
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name string
		hdr  []string
		want int
	}{
		{"none", []string{"X-API-Key", ""}, 401},
		{"wrong", []string{"X-API-Key", "cube_0000000000000000000000000000000000000000"}, 401},
		{"right", nil, 200},
		{"bearer", []string{"X-API-Key", "", "Authorization", "Bearer " + e.key}, 200},
		{"bearer lowercase", []string{"X-API-Key", "", "Authorization", "bearer " + e.key}, 200},
		{"bearer wrong", []string{"X-API-Key", "", "Authorization", "Bearer nope"}, 401},
		{"basic is not a key", []string{"X-API-Key", "", "Authorization", "Basic cm9vdDo="}, 401},
	}
	for _, c := range cases {
		r := e.do("GET", "/v2/sandboxes", "", c.hdr...)
		if r.status != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, r.status, r.body, c.want)
		}
		if c.want == 401 && r.errCode(t) != 401 {
			t.Errorf("%s: body code", c.name)
		}
	}
}

func TestCreateValidation(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name, body string
		want       int
	}{
		{"malformed", `{"templateID":`, 400},
		{"not an object", `[1,2]`, 400},
		{"empty", ``, 400},
		{"null", `null`, 400},
		{"missing template", `{"timeout":10}`, 400},
		{"unknown template", `{"templateID":"nope"}`, 400},
		{"negative timeout", `{"templateID":"base","timeout":-5}`, 400},
		{"zero timeout", `{"templateID":"base","timeout":0}`, 400},
		{"huge timeout", `{"templateID":"base","timeout":86401}`, 400},
		{"overflow timeout", `{"templateID":"base","timeout":99999999999999999999}`, 400},
		{"float timeout", `{"templateID":"base","timeout":1.5}`, 400},
		{"metadata not strings", `{"templateID":"base","metadata":{"a":1}}`, 400},
		{"bad denyOut", `{"templateID":"base","network":{"denyOut":["nope nope"]}}`, 400},
		{"volume mounts", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 501},
		{"ok with unknown fields", `{"templateID":"base","secure":true,"whatever":{"x":1},"timeout":86400}`, 201},
	}
	for _, c := range cases {
		r := e.do("POST", "/v2/sandboxes", c.body)
		if r.status != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, r.status, r.body, c.want)
			continue
		}
		if c.want >= 400 && r.errCode(t) != c.want {
			t.Errorf("%s: body code mismatch", c.name)
		}
	}
	if r := e.do("POST", "/v2/sandboxes", `{"templateID":"nope"}`); !strings.Contains(string(r.body), `template \"nope\" not found`) {
		t.Errorf("unknown template message: %s", r.body)
	}
	big := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", MaxBodyBytes) + `"}}`
	if r := e.do("POST", "/v2/sandboxes", big); r.status != 413 || r.errCode(t) != 413 {
		t.Errorf("oversized body: %d", r.status)
	}
}

func TestCreateGetKill(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"k":"v"},"envVars":{"A":"1"},"timeout":300,"autoPause":true,"allow_internet_access":false}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var raw map[string]any
	r.json(t, &raw)
	for _, f := range []string{"sandboxID", "templateID", "envdVersion", "envdAccessToken", "domain", "clientID", "alias"} {
		if _, ok := raw[f]; !ok {
			t.Errorf("create response lacks %q: %s", f, r.body)
		}
	}
	if raw["domain"] != "cube.test" || raw["clientID"] != "cube" || raw["envdVersion"] != "0.2.4" || raw["templateID"] != "base" {
		t.Errorf("create response: %s", r.body)
	}
	id := raw["sandboxID"].(string)

	r = e.do("GET", "/sandboxes/"+id, "")
	if r.status != 200 {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	var d map[string]any
	r.json(t, &d)
	for f, want := range map[string]any{"sandboxID": id, "state": "running", "cpuCount": 2.0, "memoryMB": 1024.0,
		"diskSizeMB": 4096.0, "envdVersion": "0.2.4", "allowInternetAccess": false, "clientID": "cube"} {
		if d[f] != want {
			t.Errorf("detail %s = %v, want %v", f, d[f], want)
		}
	}
	if d["metadata"].(map[string]any)["k"] != "v" || d["lifecycle"].(map[string]any)["onTimeout"] != "pause" {
		t.Errorf("detail: %s", r.body)
	}
	started, err1 := time.Parse(time.RFC3339, d["startedAt"].(string))
	end, err2 := time.Parse(time.RFC3339, d["endAt"].(string))
	if err1 != nil || err2 != nil || end.Sub(started) < 299*time.Second || end.Sub(started) > 301*time.Second {
		t.Errorf("times: %v %v %v %v", started, end, err1, err2)
	}

	if r := e.do("DELETE", "/sandboxes/"+id, ""); r.status != 204 {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	if e.node.alive(id) {
		t.Fatal("node sandbox still alive after kill")
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/" + id, ""},
		{"DELETE", "/sandboxes/" + id, ""},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":10}`},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{}`},
		{"POST", "/sandboxes/" + id + "/pause", `{}`},
		{"GET", "/sandboxes/" + id + "/metrics", ""},
		{"POST", "/sandboxes/" + id + "/refreshes", ``},
	} {
		r := e.do(c.method, c.path, c.body)
		if r.status != 404 || r.errCode(t) != 404 {
			t.Errorf("%s %s after kill: %d %s", c.method, c.path, r.status, r.body)
		}
	}
	var list []listedJSON
	e.do("GET", "/v2/sandboxes", "").json(t, &list)
	if len(list) != 0 {
		t.Fatalf("killed sandbox listed: %+v", list)
	}
}

func TestUnknownRouteAndMethodAreJSON(t *testing.T) {
	e := newEnv(t)
	if r := e.do("GET", "/nope", ""); r.status != 404 || r.errCode(t) != 404 {
		t.Errorf("unknown route: %d %s", r.status, r.body)
	}
	if r := e.do("PATCH", "/v2/sandboxes", ""); r.status != 405 || r.errCode(t) != 405 {
		t.Errorf("wrong method: %d %s", r.status, r.body)
	}
	for _, p := range []string{"/sandboxes/x/fork", "/sandboxes/x/snapshots"} {
		if r := e.do("POST", p, "{}"); r.status != 501 || r.errCode(t) != 501 {
			t.Errorf("%s: %d %s", p, r.status, r.body)
		}
	}
	if r := e.do("GET", "/snapshots", ""); r.status != 501 {
		t.Errorf("snapshots list: %d", r.status)
	}
}

func TestSetTimeoutShortensAndReaperKills(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base","timeout":3600}`)
	for _, bad := range []string{`{}`, `{"timeout":-1}`, `{"timeout":0}`, `{"timeout":"x"}`, `{`} {
		if r := e.do("POST", "/sandboxes/"+sb.SandboxID+"/timeout", bad); r.status != 400 || r.errCode(t) != 400 {
			t.Errorf("timeout %s: %d %s", bad, r.status, r.body)
		}
	}
	start := time.Now()
	if r := e.do("POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":1}`); r.status != 204 {
		t.Fatalf("timeout: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.node.alive(sb.SandboxID) {
		if time.Now().After(deadline) {
			t.Fatal("reaper did not kill at the shortened endAt")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Fatalf("killed after %v, before endAt", el)
	}
	// The reaper forgets the sandbox once the node's kill returned: poll
	// (the API answers faster than that since keys are cached).
	for r := e.do("GET", "/sandboxes/"+sb.SandboxID, ""); r.status != 404; r = e.do("GET", "/sandboxes/"+sb.SandboxID, "") {
		if time.Now().After(deadline) {
			t.Fatalf("expired sandbox: %d", r.status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConnectExtendOnlyAndPauseResume(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base","timeout":600}`)
	endAt := func() time.Time {
		var d detailJSON
		e.do("GET", "/sandboxes/"+sb.SandboxID, "").json(t, &d)
		return d.EndAt
	}
	before := endAt()
	if r := e.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":10}`); r.status != 200 {
		t.Fatalf("connect running: %d %s", r.status, r.body)
	}
	if !endAt().Equal(before) {
		t.Fatal("connect with a shorter timeout shortened endAt")
	}
	r := e.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", ``)
	var c sandboxJSON
	r.json(t, &c)
	if r.status != 200 || c.EnvdAccessToken != sb.EnvdAccessToken || !endAt().Equal(before) {
		t.Fatalf("connect with no body: %d %s", r.status, r.body)
	}
	e.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":1200}`)
	if !endAt().After(before) {
		t.Fatal("connect with a longer timeout did not extend")
	}
	if r := e.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", `{}`); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", ``); r.status != 409 || r.errCode(t) != 409 {
		t.Fatalf("second pause: %d %s", r.status, r.body)
	}
	var paused []listedJSON
	e.do("GET", "/v2/sandboxes?state=paused", "").json(t, &paused)
	if len(paused) != 1 || paused[0].State != "paused" {
		t.Fatalf("state filter: %+v", paused)
	}
	// Paused: envd is unreachable through the proxy.
	if r := e.do("GET", "/health", "", "E2b-Sandbox-Id", sb.SandboxID); r.status != 502 {
		t.Fatalf("proxy to paused: %d %s", r.status, r.body)
	}
	start := time.Now()
	if r := e.do("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`); r.status != 201 {
		t.Fatalf("connect paused: %d %s", r.status, r.body)
	}
	if end := endAt(); end.Before(start.Add(59*time.Second)) || end.After(start.Add(62*time.Second)) {
		t.Fatalf("resume endAt = %v, want now+60s", end)
	}
	if r := e.do("GET", "/health", "", "E2b-Sandbox-Id", sb.SandboxID); r.status != 204 {
		t.Fatalf("proxy after resume: %d %s", r.status, r.body)
	}
	if r := e.do("POST", "/sandboxes/"+sb.SandboxID+"/resume", `{}`); r.status != 409 {
		t.Fatalf("v1 resume of running: %d", r.status)
	}
	if r := e.do("POST", "/v2/sandboxes/unknownunknownunkno1/connect", `{}`); r.status != 404 || r.errCode(t) != 404 {
		t.Fatalf("connect unknown: %d", r.status)
	}
	if r := e.do("POST", "/sandboxes/"+sb.SandboxID+"/refreshes", `{"duration":30}`); r.status != 204 {
		t.Fatalf("refresh: %d %s", r.status, r.body)
	}
}

func TestMetricsAndNetwork(t *testing.T) {
	e := newEnv(t)
	sb := e.create(`{"templateID":"base"}`)
	var ms []metricJSON
	r := e.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics", "")
	r.json(t, &ms)
	if r.status != 200 || len(ms) != 1 || ms[0].CPUUsedPct != 12.5 || ms[0].MemTotal != 1<<30 || ms[0].TimestampUnix == 0 {
		t.Fatalf("metrics: %d %s", r.status, r.body)
	}
	future := time.Now().Add(time.Hour).Unix()
	e.do("GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d", sb.SandboxID, future), "").json(t, &ms)
	if len(ms) != 0 {
		t.Fatalf("metrics out of range: %+v", ms)
	}
	if r := e.do("GET", "/sandboxes/"+sb.SandboxID+"/metrics?start=yesterday", ""); r.status != 400 {
		t.Fatalf("bad start: %d", r.status)
	}
	// The test node has no NetworkUpdater: valid input is 501, invalid is 400.
	if r := e.do("PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"denyOut":["10.0.0.0/8"]}`); r.status != 501 || r.errCode(t) != 501 {
		t.Fatalf("network without updater: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/sandboxes/"+sb.SandboxID+"/network", `{"denyOut":["10.0.0.0/99"]}`); r.status != 400 {
		t.Fatalf("bad CIDR: %d %s", r.status, r.body)
	}
	if r := e.do("PUT", "/sandboxes/unknownunknownunkno1/network", `{}`); r.status != 404 {
		t.Fatalf("network unknown: %d %s", r.status, r.body)
	}
}

func TestListPaginationAndFilters(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := 0; i < 5; i++ {
		meta := fmt.Sprintf(`{"i":"%d","a b":"x&y=z"}`, i)
		if i%2 == 1 {
			meta = fmt.Sprintf(`{"i":"%d"}`, i)
		}
		ids = append(ids, e.create(`{"templateID":"base","metadata":`+meta+`}`).SandboxID)
		time.Sleep(2 * time.Millisecond)
	}
	// Walk pages of 2, ascending.
	var got []string
	path := "/v2/sandboxes?order=asc&limit=2"
	pages := 0
	for {
		r := e.do("GET", path, "")
		if r.status != 200 || r.header.Get("Access-Control-Expose-Headers") != "X-Next-Token" {
			t.Fatalf("list: %d %v", r.status, r.header)
		}
		var page []listedJSON
		r.json(t, &page)
		for _, s := range page {
			got = append(got, s.SandboxID)
		}
		pages++
		tok := r.header.Get("X-Next-Token")
		if tok == "" {
			break
		}
		path = "/v2/sandboxes?order=asc&limit=2&nextToken=" + tok
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") || pages != 3 {
		t.Fatalf("pages: %v in %d pages, want %v", got, pages, ids)
	}
	// The exact URL the SDK sends (§2.6).
	r := e.do("GET", "/v2/sandboxes?metadata=a%252520b%3Dx%252526y%25253Dz&state=running,paused&startedAfter=1970-01-01T00%3A00%3A00.000Z&template=base&order=asc&limit=5", "")
	var matched []listedJSON
	r.json(t, &matched)
	if r.status != 200 || len(matched) != 3 || matched[0].SandboxID != ids[0] || matched[2].SandboxID != ids[4] {
		t.Fatalf("SDK metadata query: %d %s", r.status, r.body)
	}
	if r.header.Get("X-Next-Token") != "" {
		t.Fatal("X-Next-Token on the last page")
	}
	// v1 list: plain JSON array, metadata filter.
	var v1 []listedJSON
	e.do("GET", "/sandboxes?metadata=i%3D3", "").json(t, &v1)
	if len(v1) != 1 || v1[0].SandboxID != ids[3] {
		t.Fatalf("v1 list: %+v", v1)
	}
	for _, q := range []string{"state=dead", "order=up", "limit=0", "limit=x", "limit=1001", "startedAfter=yesterday", "nextToken=%21%21", "metadata=%25zz"} {
		if r := e.do("GET", "/v2/sandboxes?"+q, ""); r.status != 400 || r.errCode(t) != 400 {
			t.Errorf("list ?%s: %d %s", q, r.status, r.body)
		}
	}
}
