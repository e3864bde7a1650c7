package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseHost(t *testing.T) {
	cases := []struct {
		host, domain string
		id           string
		port         uint16
		ok           bool
	}{
		{"49983-abc123.cube.test", "cube.test", "abc123", 49983, true},
		{"8080-abc123.cube.test:443", "cube.test", "abc123", 8080, true},
		{"8080-ABC123.Cube.Test.", "cube.test", "abc123", 8080, true},
		{"8080-abc123.cube.test.:3000", ".cube.test.", "abc123", 8080, true},
		{"1-a-b.cube.test", "cube.test", "a-b", 1, true},
		{"cube.test", "cube.test", "", 0, false},
		{"api.cube.test", "cube.test", "", 0, false},
		{"8080-abc.x.cube.test", "cube.test", "", 0, false},
		{"0-abc.cube.test", "cube.test", "", 0, false},
		{"65536-abc.cube.test", "cube.test", "", 0, false},
		{"+80-abc.cube.test", "cube.test", "", 0, false},
		{"80-.cube.test", "cube.test", "", 0, false},
		{"80-abc.evilcube.test", "cube.test", "", 0, false},
		{"80-ab_c.cube.test", "cube.test", "", 0, false},
		{"80-abc.cube.test", "", "", 0, false},
		{"[::1]:3000", "cube.test", "", 0, false},
		{"", "cube.test", "", 0, false},
	}
	for _, c := range cases {
		id, port, ok := ParseHost(c.host, c.domain)
		if id != c.id || port != c.port || ok != c.ok {
			t.Errorf("ParseHost(%q, %q) = %q %d %v, want %q %d %v", c.host, c.domain, id, port, ok, c.id, c.port, c.ok)
		}
	}
}

func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"49983-abc.cube.test", "8080-abc.cube.test:443", "cube.test", "[::1]:80", "1-a.cube.test."} {
		f.Add(s, "cube.test")
	}
	f.Fuzz(func(t *testing.T, host, domain string) {
		id, port, ok := ParseHost(host, domain)
		if !ok {
			return
		}
		if port == 0 || id == "" || !validID(id) {
			t.Fatalf("accepted %q: id %q port %d", host, id, port)
		}
	})
}

// mapResolver resolves ids from a map and can announce gone sandboxes.
type mapResolver struct {
	mu    sync.Mutex
	addrs map[string]string
	calls int
	gone  []func(string)
}

func (r *mapResolver) SandboxAddr(ctx context.Context, id string, port uint16) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	a, ok := r.addrs[id]
	if !ok {
		return "", errors.New("unknown")
	}
	return a, nil
}

func (r *mapResolver) OnGone(fn func(string)) { r.gone = append(r.gone, fn) }

func (r *mapResolver) kill(id string) {
	r.mu.Lock()
	delete(r.addrs, id)
	r.mu.Unlock()
	for _, fn := range r.gone {
		fn(id)
	}
}

func setup(t *testing.T, upstream http.Handler) (*httptest.Server, *mapResolver) {
	t.Helper()
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	res := &mapResolver{addrs: map[string]string{"sbx": up.Listener.Addr().String()}}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "api") })
	front := httptest.NewUnstartedServer(New(res, api, "cube.test"))
	front.Config.Protocols = Protocols()
	front.Start()
	t.Cleanup(front.Close)
	return front, res
}

func get(t *testing.T, c *http.Client, url string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestRoutingCacheAndInvalidation(t *testing.T) {
	front, res := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "up %s %s", r.URL.Path, r.Header.Get("X-Access-Token"))
	}))
	c := front.Client()
	if code, body := get(t, c, front.URL+"/v2/sandboxes"); code != 200 || body != "api" {
		t.Fatalf("fall through: %d %s", code, body)
	}
	if code, body := get(t, c, front.URL+"/files", "E2b-Sandbox-Id", "sbx", "X-Access-Token", "tok"); code != 200 || body != "up /files tok" {
		t.Fatalf("header: %d %s", code, body)
	}
	if code, body := get(t, c, front.URL+"/x", "Host", "3000-sbx.cube.test"); code != 200 || body != "up /x " {
		t.Fatalf("host: %d %s", code, body)
	}
	res.mu.Lock()
	calls := res.calls
	res.mu.Unlock()
	if calls != 2 { // (sbx,49983) and (sbx,3000), each resolved once
		get(t, c, front.URL+"/files", "E2b-Sandbox-Id", "sbx")
		t.Fatalf("resolver calls = %d, want 2 (cached)", calls)
	}
	get(t, c, front.URL+"/files", "E2b-Sandbox-Id", "sbx")
	res.mu.Lock()
	if res.calls != 2 {
		t.Fatalf("cache miss on repeat: %d calls", res.calls)
	}
	res.mu.Unlock()
	res.kill("sbx")
	code, body := get(t, c, front.URL+"/files", "E2b-Sandbox-Id", "sbx")
	if code != 502 || body != `{"code":502,"message":"sandbox sbx is not running"}` {
		t.Fatalf("after kill: %d %s", code, body)
	}
}

func TestWebSocketUpgrade(t *testing.T) {
	front, _ := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString("echo: " + line)
		brw.Flush()
	}))
	conn, err := net.DialTimeout("tcp", front.Listener.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: 49983-sbx.cube.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprint(conn, "hello\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo: hello\n" {
		t.Fatalf("echo: %q %v", line, err)
	}
}

func TestH2CStreamingThroughProxy(t *testing.T) {
	release := make(chan struct{})
	front, _ := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "one\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
		io.WriteString(w, "two\n")
	}))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: &http.Transport{Protocols: &p}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", front.URL+"/s", nil)
	req.Header.Set("E2b-Sandbox-Id", "sbx")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.ProtoMajor != 2 {
		t.Fatalf("proto %s", res.Proto)
	}
	br := bufio.NewReader(res.Body)
	if l, _ := br.ReadString('\n'); l != "one\n" {
		t.Fatalf("first: %q", l)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.HasPrefix(string(rest), "two") {
		t.Fatalf("rest %q", rest)
	}
}

func TestCacheGenerationRace(t *testing.T) {
	c := newAddrCache()
	gen := c.generation()
	c.invalidate("a")
	c.put("a", 1, "x", gen)
	if _, ok := c.get("a", 1); ok {
		t.Fatal("stale resolution cached after invalidation")
	}
	c.put("a", 1, "x", c.generation())
	c.put("a", 2, "y", c.generation())
	c.invalidate("a")
	if _, ok := c.get("a", 2); ok || c.n != 0 {
		t.Fatalf("invalidate left entries (n=%d)", c.n)
	}
}
