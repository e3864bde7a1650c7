package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/interp"
)

func buildBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cube-interp")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// children lists pid's children: /proc/PID/task/TID/children of every
// thread (a child belongs to the thread that started it).
func children(pid int) []int {
	files, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, w := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(w); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// onlyChild waits for pid to have exactly one child and returns it.
func onlyChild(t *testing.T, pid int, what string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c := children(pid); len(c) == 1 {
			return c[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("%s: pid %d has children %v, want one", what, pid, c)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie has exited too.
	f := strings.Fields(string(b))
	return len(f) > 2 && f[2] != "Z"
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func healthy(addr string) bool {
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// A server that dies inside a sandbox is started again by its supervisor
// (`cube-interp -- ARGV` starts the supervisor); its kernels die with it;
// stopping the supervisor stops the server.
func TestServerRestartsAfterCrash(t *testing.T) {
	bin := buildBin(t)
	addr := freeAddr(t)
	runDir := t.TempDir()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "--listen", addr, "--user", "", "--envd-url", "", "--prewarm=false", "--run-dir", runDir, "--",
		"/bin/sleep", "60")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range children(cmd.Process.Pid) {
			_ = syscall.Kill(c, syscall.SIGTERM)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Logf("stderr:\n%s", stderr.String())
	})
	// Once the process is ARGV, the server listens (ServeAndExec waited).
	waitFor(t, "ARGV never ran", 10*time.Second, func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline")
		return strings.HasPrefix(string(b), "/bin/sleep\x00")
	})
	supervisor := onlyChild(t, cmd.Process.Pid, "ARGV's children")
	server := onlyChild(t, supervisor, "supervisor's children")
	if !healthy(addr) {
		t.Fatal("server does not answer once ARGV runs")
	}
	kernel := 0
	if k, err := interp.FindKernels(interp.DefaultKernelDirs); err == nil {
		if _, err := k.Lookup("python"); err == nil {
			resp, err := http.Post("http://"+addr+"/contexts", "application/json", strings.NewReader(`{"language":"python"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST /contexts: %s", resp.Status)
			}
			kernel = onlyChild(t, server, "server's children (the kernel)")
		}
	}
	if kernel == 0 {
		t.Log("no python kernel here: the kernel half is not checked")
	}

	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if kernel != 0 {
		waitFor(t, "the kernel outlived its server", 5*time.Second, func() bool { return !alive(kernel) })
	}
	var again int
	waitFor(t, "no new server", 10*time.Second, func() bool {
		c := children(supervisor)
		if len(c) == 1 && c[0] != server && healthy(addr) {
			again = c[0]
			return true
		}
		return false
	})
	if !alive(supervisor) {
		t.Fatal("the supervisor died")
	}

	// SIGTERM to the supervisor (Go's default action ends it): the server
	// follows (Pdeathsig), nothing is left.
	if err := syscall.Kill(supervisor, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server outlived its supervisor", 10*time.Second, func() bool { return !alive(again) })
	if healthy(addr) {
		t.Error("port still answers after the supervisor stopped")
	}
}

// A server that cannot start (its port is taken) is not retried: the
// supervisor gives up at once, says why, and ARGV still runs.
func TestSupervisorGivesUpWhenTheFirstStartFails(t *testing.T) {
	bin := buildBin(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	out, err := exec.Command(bin, "--listen", l.Addr().String(), "--user", "", "--envd-url", "", "--prewarm=false", "--",
		"/bin/echo", "argv ran").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "argv ran") || !strings.Contains(string(out), "exited before listening") {
		t.Errorf("output %q: want ARGV's and the supervisor's reason", out)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("took %s: the supervisor waited instead of giving up", d)
	}
}
