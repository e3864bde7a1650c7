package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/deptest"
	"github.com/cube-dev/cube/internal/errdefs"
)

// TestStaysSmall: every sandbox pays for the supervisor's image, so it must
// not link what costs heap and threads at start-up. net/http and eBPF
// cost ~400 KiB of anonymous memory and one thread per sandbox, measured.
func TestStaysSmall(t *testing.T) {
	deptest.Forbid(t, "github.com/cube-dev/cube/cmd/cube-supervisor",
		"net/http/...", "crypto/tls", "github.com/cilium/ebpf/...", "os/exec", "github.com/cube-dev/cube/internal/cgroup")
}

// fakeSandbox records what the server asked of it.
type fakeSandbox struct {
	mu         sync.Mutex
	calls      []string
	err        error
	onKill     func()
	onKillInit func()
}

func (f *fakeSandbox) record(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, op)
	return f.err
}
func (f *fakeSandbox) Kill(context.Context) error {
	err := f.record("kill")
	if f.onKill != nil {
		f.onKill()
	}
	return err
}
func (f *fakeSandbox) KillInit() error {
	err := f.record("kill-init")
	if f.onKillInit != nil {
		f.onKillInit()
	}
	return err
}
func (f *fakeSandbox) Freeze(context.Context) error { return f.record("freeze") }
func (f *fakeSandbox) Thaw(context.Context) error   { return f.record("thaw") }

// serveOn starts srv on a fresh unix socket and returns its path.
func serveOn(t *testing.T, srv *server) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), SocketFile)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.serve(ln)
	t.Cleanup(func() { ln.Close(); srv.drain(time.Second) })
	return sock
}

// roundTrip sends raw and returns the status code and body of the answer.
func roundTrip(t *testing.T, sock, raw string) (int, string) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	// The server closes on an oversized request it did not read in full,
	// which resets the connection after its answer.
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	head, body, ok := strings.Cut(string(b), "\r\n\r\n")
	if !ok {
		t.Fatalf("no header end in %q", b)
	}
	var code int
	var proto string
	if _, err := fmt.Sscan(head, &proto, &code); err != nil {
		t.Fatalf("status line of %q: %v", head, err)
	}
	if !strings.Contains(head, "Connection: close") || !strings.Contains(head, "Content-Type: application/json") {
		t.Errorf("headers: %q", head)
	}
	return code, body
}

func TestServerRoutes(t *testing.T) {
	fs := &fakeSandbox{}
	srv := newServer(fs, State{ShimPID: 10, InitPID: 11, Running: true, Version: "v"})
	sock := serveOn(t, srv)

	code, body := roundTrip(t, sock, "GET /state HTTP/1.1\r\nHost: shim\r\n\r\n")
	var st State
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.ShimPID != 10 || !st.Running {
		t.Fatalf("GET /state: %d %q %v", code, body, err)
	}
	if code, body := roundTrip(t, sock, "POST /freeze HTTP/1.1\r\nHost: shim\r\nContent-Length: 0\r\n\r\n"); code != 200 || !strings.Contains(body, `"frozen":true`) {
		t.Errorf("POST /freeze: %d %q", code, body)
	}
	if code, body := roundTrip(t, sock, "POST /thaw?x=1 HTTP/1.1\r\n\r\n"); code != 200 || !strings.Contains(body, `"frozen":false`) {
		t.Errorf("POST /thaw: %d %q", code, body)
	}
	for raw, want := range map[string]int{
		"POST /state HTTP/1.1\r\n\r\n": 405,
		"GET /kill HTTP/1.1\r\n\r\n":   405,
		"GET /nope HTTP/1.1\r\n\r\n":   404,
		"garbage\r\n\r\n":              400,
		"GET /state HTTP/1.1\r\nX: " + strings.Repeat("a", maxHeader) + "\r\n\r\n": 400,
	} {
		if code, body := roundTrip(t, sock, raw); code != want || !strings.Contains(body, `"error"`) {
			t.Errorf("%.30q: %d %q, want %d with an error body", raw, code, body, want)
		}
	}
	fs.mu.Lock()
	fs.err = fmt.Errorf("boom: %w", errdefs.ErrUnavailable)
	fs.mu.Unlock()
	if code, _ := roundTrip(t, sock, "POST /freeze HTTP/1.1\r\n\r\n"); code != 503 {
		t.Errorf("failing freeze: %d, want 503", code)
	}
	fs.mu.Lock()
	calls := slices.Clone(fs.calls)
	fs.mu.Unlock()
	if !slices.Equal(calls, []string{"freeze", "thaw", "freeze"}) {
		t.Errorf("calls = %v", calls)
	}
}

// A kill answers once the init's exit is recorded; later kills answer at
// once, and freezing an ended sandbox is refused. An init that ends when
// killed spares the cgroup kill.
func TestServerKillWaitsForExit(t *testing.T) {
	fs := &fakeSandbox{}
	srv := newServer(fs, State{Running: true})
	fs.onKillInit = func() { go srv.markExited(ExitStatus{ExitCode: -1, Signal: "SIGKILL"}) }
	sock := serveOn(t, srv)
	code, body := roundTrip(t, sock, "POST /kill HTTP/1.1\r\n\r\n")
	if code != 200 || !strings.Contains(body, `"running":false`) || !strings.Contains(body, "SIGKILL") {
		t.Fatalf("POST /kill: %d %q", code, body)
	}
	if code, _ := roundTrip(t, sock, "POST /kill HTTP/1.1\r\n\r\n"); code != 200 {
		t.Errorf("second kill: %d", code)
	}
	if code, _ := roundTrip(t, sock, "POST /freeze HTTP/1.1\r\n\r\n"); code != 412 {
		t.Errorf("freeze after exit: %d, want 412", code)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fmt.Sprint(fs.calls) != "[kill-init]" {
		t.Errorf("calls = %v, want one kill of the init", fs.calls)
	}
}

// An init that outlives the grace after its kill, and a frozen sandbox
// (its tasks die only once thawed), get the cgroup kill as well.
func TestServerKillFallsBackToCgroup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		frozen bool
		want   string
	}{{"init-stays", false, "[kill-init kill]"}, {"frozen", true, "[kill]"}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fakeSandbox{}
			srv := newServer(fs, State{Running: true, Frozen: tc.frozen})
			srv.initGrace = 10 * time.Millisecond
			fs.onKill = func() { go srv.markExited(ExitStatus{ExitCode: -1, Signal: "SIGKILL"}) }
			sock := serveOn(t, srv)
			if code, body := roundTrip(t, sock, "POST /kill HTTP/1.1\r\n\r\n"); code != 200 || !strings.Contains(body, `"running":false`) {
				t.Fatalf("POST /kill: %d %q", code, body)
			}
			fs.mu.Lock()
			defer fs.mu.Unlock()
			if got := fmt.Sprint(fs.calls); got != tc.want {
				t.Errorf("calls = %s, want %s", got, tc.want)
			}
		})
	}
}

// A client that never finishes its request is cut off; it does not hold
// the server.
func TestServerSlowClient(t *testing.T) {
	srv := newServer(&fakeSandbox{}, State{Running: true})
	sock := serveOn(t, srv)
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /state HTTP/1.1\r\n")
	if code, _ := roundTrip(t, sock, "GET /state HTTP/1.1\r\n\r\n"); code != 200 {
		t.Errorf("second client behind a slow one: %d", code)
	}
}

func TestReadRequest(t *testing.T) {
	m, p, err := readRequest(bufio.NewReader(strings.NewReader("POST /kill?a=b HTTP/1.0\r\nA: b\r\n\r\n")))
	if err != nil || m != "POST" || p != "/kill" {
		t.Errorf("= %q %q %v", m, p, err)
	}
	for _, in := range []string{"", "GET /state\r\n\r\n", "GET /state SPDY/3\r\n\r\n", "GET /state HTTP/1.1\r\nA: b"} {
		if _, _, err := readRequest(bufio.NewReader(strings.NewReader(in))); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

func TestChild(t *testing.T) {
	if _, err := OpenChild(1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("OpenChild(1): %v, want ErrFailedPrecondition (not our child)", err)
	}
	if _, err := OpenChild(0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("OpenChild(0): %v", err)
	}
	for _, c := range []struct {
		argv   []string
		code   int
		signal string
		kill   bool
	}{
		{argv: []string{"/bin/sh", "-c", "exit 3"}, code: 3},
		{argv: []string{"/bin/sleep", "100"}, code: -1, signal: "SIGKILL", kill: true},
	} {
		cmd := exec.Command(c.argv[0], c.argv[1:]...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ch, err := OpenChild(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if c.kill {
			if err := ch.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		if err := ch.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		// A look without reaping, then the reaping one: same answer.
		peek, err := ch.Status(false)
		if err != nil || peek.ExitCode != c.code || peek.Signal != c.signal {
			t.Errorf("%v: Status(false) = %+v, %v", c.argv, peek, err)
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(cmd.Process.Pid)); err != nil {
			t.Errorf("%v: reaped by a look: %v", c.argv, err)
		}
		got, err := ch.Status(true)
		if err != nil || got.ExitCode != c.code || got.Signal != c.signal {
			t.Errorf("%v: Status(true) = %+v, %v", c.argv, got, err)
		}
		if _, err := ch.Status(true); err == nil {
			t.Errorf("%v: second reap succeeded", c.argv)
		}
		if err := ch.Kill(); err != nil {
			t.Errorf("%v: Kill after exit: %v", c.argv, err)
		}
		ch.Close()
	}
}
