package cubelet

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a log sink for the cubelet's handler and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSeccompLogNamesSandbox runs a cubelet with SeccompLog, makes a
// sandbox's process try a syscall outside the allowlist through envd, and
// finds the cubelet's log line naming the sandbox and the syscall; the
// call still failed with EPERM.
func TestSeccompLogNamesSandbox(t *testing.T) {
	n := newTestNode(t)
	logs := &lockedBuffer{}
	n.cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n.cfg.SeccompLog = true
	c := n.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb, err := c.CreateSandbox(ctx, createReq("sbx-seclog"))
	if err != nil {
		t.Fatal(err)
	}
	// unshare(CLONE_NEWUSER): refused by the filter; the process lives on
	// a second so that its pid still names its cgroup when the record is read.
	out := sandboxRun(ctx, t, c, sb.ID, "root", "/bin/busybox unshare -U /bin/true; echo status=$?; sleep 1")
	if !strings.Contains(out, "status=1") && !strings.Contains(out, "Operation not permitted") {
		t.Fatalf("unshare -U in the sandbox: %q, want a failure", out)
	}
	want := []string{`msg="seccomp refused a syscall"`, "sandbox=" + sb.ID, "syscall=unshare"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		line := ""
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, want[0]) && strings.Contains(l, want[2]) {
				line = l
			}
		}
		if line != "" {
			if !strings.Contains(line, want[1]) {
				t.Fatalf("log line %q does not name sandbox %s", line, sb.ID)
			}
			t.Log(line)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %v in the cubelet's log (kernel rate limit? audit daemon?):\n%s", want, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
