package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSplitArgv(t *testing.T) {
	for _, tc := range []struct {
		args, flags, argv []string
	}{
		{[]string{"--listen", "x"}, []string{"--listen", "x"}, nil},
		{[]string{"--listen", "x", "--", "/envd", "--", "a"}, []string{"--listen", "x"}, []string{"/envd", "--", "a"}},
		{[]string{"--"}, []string{}, []string{}},
	} {
		flags, argv := splitArgv(tc.args)
		if !slices.Equal(flags, tc.flags) || !slices.Equal(argv, tc.argv) || (argv == nil) != (tc.argv == nil) {
			t.Errorf("%q: %q %q", tc.args, flags, argv)
		}
	}
}

// `cube-interp -- ARGV` as a sandbox runs it: ARGV keeps the pid and the
// inherited fd (envd's ready pipe), the server does not hold that fd, and
// the server answers.
func TestDetachAndExec(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cube-interp")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--listen", addr, "--user", "", "--envd-url", "", "--prewarm=false", "--",
		"/bin/sh", "-c", `echo "$$" >&3; exec 3>&-; sleep 60`)
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/task/" + strconv.Itoa(cmd.Process.Pid) + "/children"); err == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGTERM)
				}
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	done := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r) // EOF only once nobody holds the write end
		done <- b
	}()
	select {
	case b := <-done:
		if got := strings.TrimSpace(string(b)); got != strconv.Itoa(cmd.Process.Pid) {
			t.Errorf("exec'd program wrote pid %q, want %d (the same process)", got, cmd.Process.Pid)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no EOF on the inherited fd: the server holds it")
	}
	// The server listened before the exec: no retry needed.
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		t.Fatalf("server does not answer once argv runs: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("health: %d", resp.StatusCode)
	}
}
