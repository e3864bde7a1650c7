package kubereal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// sdk runs one verb of sdk.mjs (the official e2b SDK through the
// cube-server Service) and decodes the JSON on its last stdout line.
func sdk(ctx context.Context, timeout time.Duration, out any, verb string, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"sdk.mjs", verb}, args...)...)
	cmd.Env = append(os.Environ(), "KUBEREAL_E2E_DIR="+env.E2EDir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("sdk %s: %w\n%s", verb, err, tail(stderr.String()+stdout.String(), 30))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), out); err != nil {
		return fmt.Errorf("sdk %s: decode %q: %w (stderr: %s)", verb, lines[len(lines)-1], err, tail(stderr.String(), 10))
	}
	return nil
}

// createOne creates a sandbox, runs a command, writes and reads a file and
// kills it. It returns how long that took.
func createOne(ctx context.Context) (time.Duration, error) {
	var r struct {
		ID string `json:"id"`
		Ms int64  `json:"ms"`
	}
	if err := sdk(ctx, 3*time.Minute, &r, "create-one"); err != nil {
		return 0, err
	}
	return time.Duration(r.Ms) * time.Millisecond, nil
}

func mustCreateOne(t *testing.T, why string) {
	t.Helper()
	d, err := createOne(testCtx(t))
	if err != nil {
		t.Fatalf("create (%s): %v", why, err)
	}
	t.Logf("create (%s): sandbox created, command and file ok in %v", why, d.Round(time.Millisecond))
}

// sandboxStates reports running / gone / "error: ..." per sandbox id.
func sandboxStates(ctx context.Context, ids []string) (map[string]string, error) {
	out := map[string]string{}
	return out, sdk(ctx, 2*time.Minute, &out, "states", ids...)
}

// sweepSandboxes kills every sandbox this suite tagged.
func sweepSandboxes(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var killed []string
	if err := sdk(ctx, 3*time.Minute, &killed, "sweep"); err != nil {
		t.Logf("sweep of the suite's sandboxes: %v", err)
		return
	}
	if len(killed) > 0 {
		t.Logf("swept %d sandboxes left by the suite", len(killed))
	}
}

// probeLine is one attempt of `sdk.mjs probe`: a command in a running
// sandbox through the proxy, 4 times a second.
type probeLine struct {
	T       int64  `json:"t"` // Unix ms when the attempt started
	OK      bool   `json:"ok"`
	Counter int    `json:"counter"`
	Error   string `json:"error"`
}

func (l probeLine) at() time.Time { return time.UnixMilli(l.T) }

// prober runs `sdk.mjs probe ID` for the duration of an event.
type prober struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	mu    sync.Mutex
	lines []probeLine
	other bytes.Buffer
}

func startProbe(t *testing.T, id string) *prober {
	t.Helper()
	p := &prober{done: make(chan struct{})}
	p.cmd = exec.Command("node", "sdk.mjs", "probe", id)
	p.cmd.Env = append(os.Environ(), "KUBEREAL_E2E_DIR="+env.E2EDir)
	p.cmd.Stderr = &p.other
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start probe: %v", err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l probeLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.T > 0 {
				p.mu.Lock()
				p.lines = append(p.lines, l)
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { p.stop() })
	// Wait for the first answer so the probe is running before the event.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if ls := p.snapshot(); len(ls) > 0 {
			if !ls[0].OK {
				t.Fatalf("probe of sandbox %s fails before the event: %s", id, ls[0].Error)
			}
			return p
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("probe of sandbox %s printed nothing in 60s: %s", id, tail(p.other.String(), 10))
	return nil
}

func (p *prober) snapshot() []probeLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]probeLine(nil), p.lines...)
}

// stop ends the probe (closing its stdin) and returns every attempt.
func (p *prober) stop() []probeLine {
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		_ = p.cmd.Wait()
	}
	return p.snapshot()
}

// firstOKAfter is the first successful attempt that started after t.
func firstOKAfter(lines []probeLine, t time.Time) (time.Time, bool) {
	for _, l := range lines {
		if l.OK && !l.at().Before(t) {
			return l.at(), true
		}
	}
	return time.Time{}, false
}

// outage summarizes failed attempts: how many, and the longest stretch
// from a failed attempt to the next successful one.
func outage(lines []probeLine) (failed int, longest time.Duration, sample string) {
	var since time.Time
	for _, l := range lines {
		if !l.OK {
			failed++
			if since.IsZero() {
				since = l.at()
			}
			if sample == "" {
				sample = l.Error
			}
			continue
		}
		if !since.IsZero() {
			longest = max(longest, l.at().Sub(since))
			since = time.Time{}
		}
	}
	if !since.IsZero() && len(lines) > 0 {
		longest = max(longest, lines[len(lines)-1].at().Sub(since))
	}
	return failed, longest, sample
}
