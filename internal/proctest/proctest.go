// Package proctest runs Cube's real binaries in tests: it builds them once
// per test binary and starts, signals and reads the logs of cube processes
// (server, cubelet, up) that the test owns.
package proctest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/nativebin"
)

// Build compiles cube, envd, cube-shim, cube-supervisor and the C programs
// cube-nsexec and cube-reaper from this module into dir (all but cube
// static, as `make build` does).
func Build(dir string) error {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	for _, b := range []struct{ out, pkg, cgo string }{
		{"cube", "./cmd/cube", "1"}, {"envd", "./cmd/envd", "0"}, {"cube-shim", "./cmd/cube-shim", "0"},
		{"cube-supervisor", "./cmd/cube-supervisor", "0"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return nativebin.BuildAll(context.Background(), dir)
}

// RandHex returns n random bytes, hex encoded (unique names per test).
func RandHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Proc is a process started by a test, logging to a file; it is killed at
// the test's cleanup.
type Proc struct {
	cmd *exec.Cmd
	Log string
}

// Start runs bin with args in its own process group, appending its output
// to log.
func Start(t testing.TB, bin, log string, args ...string) *Proc {
	t.Helper()
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p := &Proc{cmd: cmd, Log: log}
	t.Cleanup(func() { p.Kill(syscall.SIGKILL) })
	return p
}

// Kill sends sig and waits for the process to exit (SIGKILL after 30 s).
// It is a no-op once the process has exited.
func (p *Proc) Kill(sig syscall.Signal) {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// Read returns the whole log.
func (p *Proc) Read() string {
	b, _ := os.ReadFile(p.Log)
	return string(b)
}

// Tail returns the last 3000 bytes of the log.
func (p *Proc) Tail() string {
	s := p.Read()
	if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	return s
}

// CallJSON sends method path (JSON body, API key) to base, fails the test
// unless the status is want, and decodes the response into out (if non-nil).
func CallJSON(t testing.TB, base, key, method, path string, body, out any, want int) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, base+path, rd)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("%s %s: %d %s (want %d)", method, path, res.StatusCode, data, want)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: decode %s: %v", method, path, data, err)
		}
	}
}

// StartPrintingPID starts argv (typically under unshare) and returns the pid
// it prints with `echo $$` or `echo $!` as its first line of output: a
// process in namespaces of its own, for tests that look at it from outside.
// The process is killed when the test ends.
func StartPrintingPID(t testing.TB, argv ...string) int {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("%v printed %q", argv, line)
	}
	return pid
}
