package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clusterCgroup holds every process kube-up starts (in every hierarchy):
// kube-down kills what is left in it, e.g. containerd's shims.
const clusterCgroup = "cube-kube"

// component is one long-running process of the cluster.
type component struct {
	name string
	path string
	args []string
	cred *syscall.Credential // nil: root
	// ready is polled until it returns nil (bounded by the caller's context).
	ready func(ctx context.Context) error
}

// proc is a started component; exited closes when it ends (while kube-up
// still runs: afterwards it is no child of anyone we know).
type proc struct {
	component
	pid    int
	exited chan struct{}
	err    error
}

func (c *Config) logFile(name string) string { return c.p("logs", name+".log") }
func (c *Config) pidFile(name string) string { return c.p("pids", name+".pid") }

// start runs comp detached (own session, output to Dir/logs/<name>.log),
// records its pid in Dir/pids/<name>.pid and waits for comp.ready.
func start(ctx context.Context, c *Config, comp component) (*proc, error) {
	for _, d := range []string{c.p("logs"), c.p("pids")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	logf, err := os.OpenFile(c.logFile(comp.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if comp.cred != nil {
		os.Chown(c.logFile(comp.name), int(comp.cred.Uid), int(comp.cred.Gid))
	}
	cmd := exec.Command(comp.path, comp.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: comp.cred}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", comp.name, err)
	}
	p := &proc{component: comp, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	if err := os.WriteFile(c.pidFile(comp.name), []byte(strconv.Itoa(p.pid)+"\n"), 0o644); err != nil {
		return nil, err
	}
	slog.Info("started", "component", comp.name, "pid", p.pid)
	if comp.ready == nil {
		return p, nil
	}
	var last error
	for {
		if last = comp.ready(ctx); last == nil {
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("%s exited during start-up (%v); log %s:\n%s", comp.name, p.err, c.logFile(comp.name), tail(c.logFile(comp.name), 30))
		case <-ctx.Done():
			return nil, fmt.Errorf("%s not ready: %w (last: %v); log %s:\n%s", comp.name, ctx.Err(), last, c.logFile(comp.name), tail(c.logFile(comp.name), 30))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// httpReady probes url (https without verification: the probe asks only
// whether the component serves; the components themselves verify).
func httpReady(url string) func(context.Context) error {
	cl := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// dialReady waits until addr ("unix:PATH" or host:port) accepts connections.
func dialReady(addr string) func(context.Context) error {
	network := "tcp"
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", p
	}
	return func(ctx context.Context) error {
		conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}

// readPid returns the recorded pid of name if that process still runs the
// same program (a recycled pid is not ours).
func readPid(c *Config, name string) (int, bool) {
	b, err := os.ReadFile(c.pidFile(name))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return 0, false
	}
	want := map[string]string{"postgres": "postgres", "containerd": "containerd"}[name]
	if want == "" {
		want = name
	}
	if !strings.HasPrefix(filepath.Base(exe), want) {
		return 0, false
	}
	return pid, true
}

// stopRecorded sends SIGTERM (postgres: SIGINT) to the recorded pid of name, waits up to grace,
// then SIGKILLs it. A process that is gone is fine.
func stopRecorded(c *Config, name string, grace time.Duration) error {
	defer os.Remove(c.pidFile(name))
	pid, ok := readPid(c, name)
	if !ok {
		return nil
	}
	slog.Info("stopping", "component", name, "pid", pid)
	sig := syscall.SIGTERM
	if name == "postgres" {
		sig = syscall.SIGINT // fast shutdown: SIGTERM would wait for every client to leave
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: %w", name, err)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	for range 50 {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("stop %s: pid %d survived SIGKILL", name, pid)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 {
		return s[i+2] != 'Z'
	}
	return true
}
