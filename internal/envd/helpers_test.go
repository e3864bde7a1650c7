package envd_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cube-dev/cube/api/gen/envd/filesystem/filesystemconnect"
	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/api/gen/envd/process/processconnect"
	"github.com/cube-dev/cube/internal/envd"
)

// testUID is the uid of the non-root user in the test passwd file.
const testUID = 1000

type env struct {
	url     string
	srv     *envd.Server
	proc    processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
	token   string
	userDir string // home of the non-root "tester" user (uid 1000)
	rootDir string // home of "root" in the test passwd (a temp dir)
}

// newEnv serves envd in-process with a temp passwd file holding root and a
// uid-1000 user "tester"; the default user is root.
func newEnv(t *testing.T, mutate ...func(*envd.Config)) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (runs commands as other users)")
	}
	dir := t.TempDir()
	// The non-root user's home must be reachable by uid 1000: t.TempDir's
	// parent is 0700, so use a separate world-traversable dir.
	userDir, err := os.MkdirTemp("", "envd-user-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(userDir) })
	if err := os.Chmod(userDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(userDir, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	rootDir := filepath.Join(dir, "root-home")
	if err := os.Mkdir(rootDir, 0o700); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	writeFile(t, passwd, fmt.Sprintf("root:x:0:0:root:%s:/bin/sh\n# comment\nbroken-line\ntester:x:%d:%d::%s:/bin/sh\n", rootDir, testUID, testUID, userDir))
	writeFile(t, group, fmt.Sprintf("root:x:0:\ntester:x:%d:\nextra:x:2345:tester,other\n", testUID))
	cfg := envd.Config{
		DefaultUser: "root",
		PasswdFile:  passwd,
		GroupFile:   group,
		EnvVars:     map[string]string{"SANDBOX_VAR": "sbx", "OVERRIDE": "sandbox"},
	}
	for _, m := range mutate {
		m(&cfg)
	}
	srv := envd.NewServer(cfg)
	hs := httptest.NewUnstartedServer(srv)
	hs.EnableHTTP2 = false
	hs.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("close server: %v", err)
		}
		hs.CloseClientConnections()
		hs.Close()
	})
	e := &env{url: hs.URL, srv: srv, token: cfg.AccessToken, userDir: userDir, rootDir: rootDir}
	opts := []connect.ClientOption{connect.WithProtoJSON(), connect.WithInterceptors(tokenInterceptor(cfg.AccessToken))}
	e.proc = processconnect.NewProcessClient(hs.Client(), hs.URL, opts...)
	e.fs = filesystemconnect.NewFilesystemClient(hs.Client(), hs.URL, opts...)
	return e
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// tokenInterceptor adds X-Access-Token to every call.
func tokenInterceptor(token string) connect.Interceptor {
	return &headerInterceptor{key: "X-Access-Token", value: token}
}

type headerInterceptor struct{ key, value string }

func (h *headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if h.value != "" {
			req.Header().Set(h.key, h.value)
		}
		return next(ctx, req)
	}
}

func (h *headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		if h.value != "" {
			conn.RequestHeader().Set(h.key, h.value)
		}
		return conn
	}
}

func (h *headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// basicUser is the Authorization header selecting user name.
func basicUser(name string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":"))
}

// testCtx is a per-test context with a hard bound so nothing hangs.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// result is everything one Start/Connect stream produced.
type result struct {
	pid            uint32
	stdout, stderr []byte
	pty            []byte
	end            *pb.ProcessEvent_EndEvent
	keepalives     int
	events         []*pb.ProcessEvent
}

// eventStream is what Start and Connect client streams have in common.
type eventStream interface {
	Receive() bool
	Err() error
}

// collect reads a stream until it ends; the first event must be start.
func collect[T interface{ GetEvent() *pb.ProcessEvent }](t *testing.T, s interface {
	eventStream
	Msg() T
}) result {
	t.Helper()
	var r result
	first := true
	for s.Receive() {
		ev := s.Msg().GetEvent()
		r.events = append(r.events, ev)
		if first {
			if ev.GetStart() == nil {
				t.Fatalf("first event is %v, want start", ev)
			}
			r.pid = ev.GetStart().GetPid()
			first = false
			continue
		}
		switch {
		case ev.GetData() != nil:
			d := ev.GetData()
			r.stdout = append(r.stdout, d.GetStdout()...)
			r.stderr = append(r.stderr, d.GetStderr()...)
			r.pty = append(r.pty, d.GetPty()...)
		case ev.GetEnd() != nil:
			r.end = ev.GetEnd()
		case ev.GetKeepalive() != nil:
			r.keepalives++
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	return r
}

// startCmd builds a Start request for sh -c script.
func startCmd(script string) *pb.StartRequest {
	no := false
	return &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}, Stdin: &no}
}

// wantCode asserts err is a Connect error with code.
func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("got %v (%v), want %v", got, err, code)
	}
}

// do sends a plain HTTP request with the env's token.
func (e *env) do(t *testing.T, req *http.Request) *http.Response {
	t.Helper()
	if e.token != "" && req.Header.Get("X-Access-Token") == "" {
		req.Header.Set("X-Access-Token", e.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func mkdirAll(p string) error { return os.MkdirAll(p, 0o755) }

// filesSign computes an E2B v1 signature independently of the code under
// test: "v1_" + unpadded base64(sha256("path:op:user:token[:exp]")).
func filesSign(path, op, user, token string, exp int64) string {
	msg := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		msg += fmt.Sprintf(":%d", exp)
	}
	sum := sha256.Sum256([]byte(msg))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}
