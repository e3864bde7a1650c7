package nativebin

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// build compiles name into a temporary directory.
func build(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	if err := Build(context.Background(), name, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// run runs bin with args and env, returning its exit code and output.
func run(t *testing.T, bin string, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// TestReaper checks cube-reaper's contract, the one envd's own pid-1 mode
// (internal/envd/reaper) keeps: the child's exit code (128+N for signal N),
// the fd it passes on and no other, the marker in the child's environment,
// adoption of an existing child, refusal of bad arguments, and orphans
// reaped when it is pid 1.
func TestReaper(t *testing.T) {
	reaper := build(t, "cube-reaper")
	env := []string{"PATH=/usr/bin:/bin"}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"exit code", []string{"--", "/bin/sh", "-c", "exit 7"}, 7, ""},
		{"killed by a signal", []string{"--", "/bin/sh", "-c", "kill -9 $$"}, 128 + 9, ""},
		{"marker for envd", []string{"--", "/bin/sh", "-c", `echo "$CUBE_ENVD_REAPED"`}, 0, "1\n"},
		{"program missing", []string{"--", "/nonexistent"}, 1, "cube-reaper: start /nonexistent: No such file or directory\n"},
		{"no argv", []string{"--"}, 2, "usage"},
		{"no --", []string{"/bin/true"}, 2, "usage"},
		{"nothing", nil, 2, "usage"},
		{"fd 2", []string{"--inherit-fd", "2", "--", "/bin/true"}, 2, "usage"},
		{"fd not a number", []string{"--inherit-fd", "x", "--", "/bin/true"}, 2, "usage"},
		{"fd missing", []string{"--inherit-fd"}, 2, "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := run(t, reaper, env, tc.args...)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("exit %d, output %q; want %d and %q", code, out, tc.wantCode, tc.wantOut)
			}
		})
	}
	t.Run("adopts a child", func(t *testing.T) {
		code, out := run(t, "/bin/sh", env, "-c", `(sleep 0.2; exit 3) & CUBE_REAP_PID=$! exec `+reaper)
		if code != 3 {
			t.Errorf("exit %d (%q), want the adopted child's 3", code, out)
		}
	})
	t.Run("passes on one fd and closes its copy", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		other, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		// fd 3 = w (passed on), fd 4 = other (not). The child answers on
		// fd 3, closes it and lives on: EOF must come before it ends.
		cmd := exec.Command(reaper, "--inherit-fd", "3", "--", "/bin/sh", "-c",
			`if [ -e /proc/self/fd/4 ]; then echo leaked >&3; else echo ok >&3; fi; exec 3>&-; sleep 2`)
		cmd.Env = env
		cmd.ExtraFiles = []*os.File{w, other}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		got := make(chan string, 1)
		go func() { b, _ := io.ReadAll(r); got <- string(b) }()
		select {
		case s := <-got:
			if s != "ok\n" {
				t.Errorf("child said %q, want ok (fd 4 not passed on)", s)
			}
		case <-time.After(1500 * time.Millisecond):
			t.Error("no EOF while the child lives: the reaper kept its copy of the fd")
		}
	})
	t.Run("SIGTERM ends it", func(t *testing.T) {
		cmd := exec.Command(reaper, "--", "/bin/sleep", "1")
		cmd.Env = env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != 128+15 {
			t.Errorf("exit %d after SIGTERM, want 143", code)
		}
	})
	t.Run("reaps orphans as pid 1", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root: a pid namespace")
		}
		// Three orphans end while the child sleeps; none may stay a zombie.
		script := `for i in 1 2 3; do (sleep 0.1 &); done; sleep 0.6; n=0; for f in /proc/[0-9]*/stat; do
			case "$(cut -d' ' -f3 "$f" 2>/dev/null)" in Z) n=$((n+1));; esac; done; echo "zombies=$n"`
		code, out := run(t, "unshare", env, "-fp", "--mount-proc", reaper, "--", "/bin/sh", "-c", script)
		if code != 0 || !strings.Contains(out, "zombies=0") {
			t.Errorf("exit %d, %q; want zombies=0", code, out)
		}
	})
}
