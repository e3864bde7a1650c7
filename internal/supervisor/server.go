package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Sandbox is what the server acts on: one sandbox's processes.
type Sandbox interface {
	// KillInit SIGKILLs the sandbox's init, the pid 1 of its pid
	// namespace: the kernel takes every process of the namespace with it
	// before the init's exit is reported.
	KillInit() error
	// Kill kills every process of the sandbox and returns once they are gone.
	Kill(ctx context.Context) error
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
}

// server answers the shim API (GET /state, POST /kill, /freeze, /thaw) on
// the unix socket. It speaks just enough HTTP/1.1 for the agent's client
// (package shim's, as small): one request per connection, no request body,
// JSON answers with Connection: close. net/http's server would cost every
// sandbox ~200 KiB of heap and a thread.
type server struct {
	sb     Sandbox
	mu     sync.Mutex
	state  State
	exited chan struct{} // closed once exit.json is written
	conns  sync.WaitGroup
	// initGrace is how long a kill waits for the init's exit alone before
	// it kills the cgroup's processes too (initExitGrace; tests shorten it).
	initGrace time.Duration
}

// initExitGrace bounds the wait for a killed init's exit (normally a few
// milliseconds, more with many kills at once) before the cgroup is
// frozen, killed and thawed as well.
const initExitGrace = time.Second

func newServer(sb Sandbox, st State) *server {
	return &server{sb: sb, state: st, exited: make(chan struct{}), initGrace: initExitGrace}
}

// markExited records the init's end and releases /kill waiters.
func (s *server) markExited(e ExitStatus) {
	s.mu.Lock()
	s.state.Running, s.state.Frozen = false, false
	s.state.ExitCode, s.state.Signal, s.state.ExitedAt = e.ExitCode, e.Signal, e.ExitedAt
	s.mu.Unlock()
	close(s.exited)
}

func (s *server) snapshot() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// serve accepts connections until ln is closed.
func (s *server) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: back off
			continue
		}
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			s.handle(c)
		}()
	}
}

// drain waits (up to d) for the requests in flight to be answered.
func (s *server) drain(d time.Duration) {
	done := make(chan struct{})
	go func() { s.conns.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// headerTimeout bounds how long a client may take to send its request.
const headerTimeout = 10 * time.Second

// maxHeader bounds a request's line and headers.
const maxHeader = 8 << 10

func (s *server) handle(c net.Conn) {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	method, path, err := readRequest(bufio.NewReaderSize(c, 512))
	if err != nil {
		writeResponse(c, 400, ErrorBody{Error: err.Error()})
		return
	}
	code, body := s.route(method, path)
	_ = c.SetWriteDeadline(time.Now().Add(headerTimeout))
	writeResponse(c, code, body)
}

// route runs one request and returns the status and JSON body.
func (s *server) route(method, path string) (int, any) {
	switch path {
	case "/state":
		if method != "GET" {
			return 405, ErrorBody{Error: "method " + method + " not allowed on " + path}
		}
		return 200, s.snapshot()
	case "/kill", "/freeze", "/thaw":
		if method != "POST" {
			return 405, ErrorBody{Error: "method " + method + " not allowed on " + path}
		}
	default:
		return 404, ErrorBody{Error: path + " not found"}
	}
	var err error
	switch path {
	case "/kill":
		err = s.kill()
	case "/freeze":
		err = s.setFrozen(true)
	case "/thaw":
		err = s.setFrozen(false)
	}
	if err != nil {
		return errdefs.HTTPStatus(err), ErrorBody{Error: err.Error()}
	}
	return 200, s.snapshot()
}

// kill kills the sandbox and returns once the init's exit is recorded.
func (s *server) kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	select {
	case <-s.exited:
		return nil
	default:
	}
	// The init's death ends the whole pid namespace: wait for that first.
	// Killing the cgroup at once (freeze, list, signal, thaw, poll until
	// empty) raced the kernel's own teardown, and on cgroup v1 the freeze
	// polls until the dying tasks are gone: with 50 kills at once that was
	// several polls per kill. The cgroup is still killed when the init does
	// not end in time, and at once for a frozen sandbox (its tasks die only
	// once thawed); after the init's exit, run kills any leftovers anyway.
	if !s.snapshot().Frozen {
		if err := s.sb.KillInit(); err != nil {
			return fmt.Errorf("kill sandbox: %w", err)
		}
		t := time.NewTimer(s.initGrace)
		defer t.Stop()
		select {
		case <-s.exited:
			return nil
		case <-t.C:
		}
	}
	if err := s.sb.Kill(ctx); err != nil {
		return fmt.Errorf("kill sandbox: %w", err)
	}
	select {
	case <-s.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("init did not exit after kill: %w", errdefs.ErrUnavailable)
	}
}

func (s *server) setFrozen(frozen bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !s.snapshot().Running {
		return fmt.Errorf("sandbox is not running: %w", errdefs.ErrFailedPrecondition)
	}
	op := s.sb.Thaw
	if frozen {
		op = s.sb.Freeze
	}
	if err := op(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.state.Frozen = frozen
	s.mu.Unlock()
	return nil
}

// readRequest reads a request line and its headers and returns the method
// and path (without query). A body is not read: the API takes none.
func readRequest(r *bufio.Reader) (method, path string, err error) {
	n := 0
	line, err := readLine(r, &n)
	if err != nil {
		return "", "", err
	}
	parts := strings.Fields(line)
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") {
		return "", "", fmt.Errorf("malformed request line %q", line)
	}
	method, path = parts[0], parts[1]
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	for {
		h, err := readLine(r, &n)
		if err != nil {
			return "", "", err
		}
		if h == "" {
			return method, path, nil
		}
	}
}

func readLine(r *bufio.Reader, n *int) (string, error) {
	var b []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return "", fmt.Errorf("read request: %w", err)
		}
		*n += len(chunk) + 2
		if *n > maxHeader {
			return "", fmt.Errorf("request header larger than %d bytes", maxHeader)
		}
		b = append(b, chunk...)
		if !isPrefix {
			return string(b), nil
		}
	}
}

func writeResponse(c net.Conn, code int, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		code, b = 500, []byte(`{"error":"encode answer"}`)
	}
	b = append(b, '\n')
	head := "HTTP/1.1 " + strconv.Itoa(code) + " " + statusText(code) +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(b)) +
		"\r\nConnection: close\r\n\r\n"
	_, _ = c.Write(append([]byte(head), b...))
}

// statusText is the reason phrase of the codes errdefs.HTTPStatus yields.
func statusText(code int) string {
	switch code {
	case 200:
		return "OK"
	case 400:
		return "Bad Request"
	case 401:
		return "Unauthorized"
	case 403:
		return "Forbidden"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 409:
		return "Conflict"
	case 412:
		return "Precondition Failed"
	case 429:
		return "Too Many Requests"
	case 501:
		return "Not Implemented"
	case 503:
		return "Service Unavailable"
	}
	return "Internal Server Error"
}
