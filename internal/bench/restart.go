package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RestartResult is the time a restarted `cube up` needs to serve again.
type RestartResult struct {
	Sandboxes int `json:"sandboxes"`
	// Signal stopped the old process: SIGTERM (a clean stop with
	// --keep-sandboxes) or SIGKILL (a crash).
	Signal string `json:"signal"`
	// StopSec is the signal until the old process exited.
	StopSec float64 `json:"stopSec"`
	// HealthMs is exec of the new process until GET /health answered.
	HealthMs float64 `json:"healthMs"`
	// ServingMs is exec until every sandbox's envd answered /health
	// through the proxy (the restart-to-serving time).
	ServingMs float64 `json:"servingMs"`
	// Reachable counts sandboxes whose envd answered after the restart.
	Reachable int    `json:"reachable"`
	PID       int    `json:"pid"`
	Log       string `json:"log"`
	Error     string `json:"error,omitempty"`
}

// RunRestart creates n sandboxes, stops the `cube up` that owns node's data
// dir with sig (SIGTERM, or SIGKILL for a crash), starts it again with the
// same command line, environment and working directory (detached, output
// appended to logPath), and times until it serves /health and every
// sandbox's envd again. With SIGTERM the old process must have been started
// with --keep-sandboxes. The sandboxes are killed afterwards; the new
// process is left running.
func RunRestart(ctx context.Context, c *Client, node Node, n int, logPath string, sig syscall.Signal) RestartResult {
	if err := restartable(node, sig); err != nil {
		return RestartResult{Log: logPath, Signal: sig.String(), Error: err.Error()}
	}
	ids, cerr := createIdle(ctx, c, n, 4)
	defer killAll(context.WithoutCancel(ctx), c, ids, 8, nil)
	if cerr != nil {
		return RestartResult{Log: logPath, Signal: sig.String(), Sandboxes: len(ids),
			Error: fmt.Sprintf("create sandboxes before restart: %v", cerr)}
	}
	return restartOver(ctx, c, node, ids, logPath, sig)
}

// restartable checks that the cube up of node can be restarted with sig
// without losing its sandboxes (a SIGKILL never lets it clean up).
func restartable(node Node, sig syscall.Signal) error {
	if node.DataDir == "" {
		return fmt.Errorf("restart needs --data-dir (the node-local data dir of the running cube up)")
	}
	pid, argv, _, _, err := readUpProcess(node.DataDir)
	if err != nil {
		return err
	}
	if sig != syscall.SIGKILL && !slices.ContainsFunc(argv, isKeepSandboxes) {
		return fmt.Errorf("cube up (pid %d) was not started with --keep-sandboxes: restarting it with %s would kill the sandboxes", pid, sig)
	}
	return nil
}

// restartOver restarts the cube up of node while ids run and times it (see
// RunRestart); it kills none of them.
func restartOver(ctx context.Context, c *Client, node Node, ids []string, logPath string, sig syscall.Signal) RestartResult {
	r := RestartResult{Log: logPath, Signal: sig.String(), Sandboxes: len(ids)}
	fail := func(err error) RestartResult { r.Error = err.Error(); return r }
	if err := restartable(node, sig); err != nil {
		return fail(err)
	}
	pid, argv, env, cwd, err := readUpProcess(node.DataDir)
	if err != nil {
		return fail(err)
	}

	t0 := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		return fail(fmt.Errorf("%s cube up %d: %w", sig, pid, err))
	}
	if err := waitGone(ctx, pid, 2*time.Minute); err != nil {
		return fail(err)
	}
	r.StopSec = round2(time.Since(t0).Seconds())
	c.Close() // the old connections point at the dead process

	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fail(err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir = env, cwd
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("restart cube up: %w", err))
	}
	r.PID = cmd.Process.Pid
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // reap it if it dies; it outlives us otherwise

	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := poll(wctx, exited, func() error { return c.Health(wctx) }); err != nil {
		return fail(fmt.Errorf("restarted cube never answered /health: %w", err))
	}
	r.HealthMs = ms(time.Since(start))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, 16)
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := poll(wctx, exited, func() error { return c.EnvdHealth(wctx, id) })
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				r.Reachable++
			} else if firstErr == nil {
				firstErr = fmt.Errorf("sandbox %s not reachable after restart: %w", id, err)
			}
		})
	}
	wg.Wait()
	r.ServingMs = ms(time.Since(start))
	if firstErr != nil {
		r.Error = firstErr.Error()
	}
	return r
}

// poll calls f every millisecond until it succeeds, ctx ends or exited closes.
func poll(ctx context.Context, exited <-chan struct{}, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-exited:
			return fmt.Errorf("cube up exited (last: %v)", err)
		case <-time.After(time.Millisecond):
		}
	}
}

func isKeepSandboxes(a string) bool {
	return a == "--keep-sandboxes" || a == "-keep-sandboxes" || a == "--keep-sandboxes=true" || a == "-keep-sandboxes=true"
}

// readUpProcess finds the `cube up` owning dataDir (its cube.pid) and reads
// its command line, environment and working directory from /proc.
func readUpProcess(dataDir string) (pid int, argv, env []string, cwd string, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "cube.pid"))
	if err != nil {
		return 0, nil, nil, "", fmt.Errorf("find cube up: %w", err)
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, nil, nil, "", fmt.Errorf("parse %s/cube.pid: %w", dataDir, err)
	}
	proc := "/proc/" + strconv.Itoa(pid)
	cl, err := os.ReadFile(proc + "/cmdline")
	if err != nil {
		return 0, nil, nil, "", fmt.Errorf("cube up pid %d: %w", pid, err)
	}
	argv = SplitNul(cl)
	en, err := os.ReadFile(proc + "/environ")
	if err != nil {
		return 0, nil, nil, "", err
	}
	env = SplitNul(en)
	if cwd, err = os.Readlink(proc + "/cwd"); err != nil {
		return 0, nil, nil, "", err
	}
	// Use the binary the process runs, not a PATH lookup of argv[0].
	if exe, err := os.Readlink(proc + "/exe"); err == nil && !strings.HasSuffix(exe, " (deleted)") {
		argv[0] = exe
	}
	if len(argv) < 2 || argv[1] != "up" {
		return 0, nil, nil, "", fmt.Errorf("pid %d in %s/cube.pid is not `cube up`: %q", pid, dataDir, argv)
	}
	return pid, argv, env, cwd, nil
}

// SplitNul splits a NUL-separated /proc list, dropping the trailing empty item.
func SplitNul(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\x00")
}

func waitGone(ctx context.Context, pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for syscall.Kill(pid, 0) == nil && !zombie(pid) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("cube up %d still running %s after the signal", pid, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// zombie reports whether pid has exited but is not reaped yet.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses, which may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}
