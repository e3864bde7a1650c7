package kubereal

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// diagnoseOnFailure makes a failing test print what is needed to see why:
// the cube-node Pod's logs (current and previous container), its events,
// the logs of the last Pod that was replaced, the namespace's recent
// events, the cube-server logs and the server's view of the node.
func diagnoseOnFailure(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			dumpDiagnostics(t)
		}
	})
}

func dumpDiagnostics(t *testing.T) {
	t.Helper()
	// t.Context() is already canceled in cleanups.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	show := func(title string, args ...string) {
		out, err := kubectl(ctx, args...)
		if err != nil {
			out = err.Error()
		}
		t.Logf("==== %s ====\n%s", title, tail(out, 300))
	}
	show("pods", "get", "pods", "-o", "wide")
	pods, err := nodePods(ctx)
	if err != nil {
		t.Logf("list cube-node Pods: %v", err)
	}
	for _, p := range pods {
		show("cube-node Pod "+p.Name+": cubelet log", "logs", p.Name, "-c", "cubelet", "--tail=300", "--timestamps")
		show("cube-node Pod "+p.Name+": cubelet log, previous container", "logs", p.Name, "-c", "cubelet", "--previous", "--tail=150", "--timestamps")
		show("cube-node Pod "+p.Name+": wait-node-prep log", "logs", p.Name, "-c", "wait-node-prep", "--tail=50")
		show("cube-node Pod "+p.Name+": events", "get", "events", "--field-selector", "involvedObject.name="+p.Name, "--sort-by=.lastTimestamp")
	}
	if name, log := oldPodLog.get(); name != "" {
		t.Logf("==== replaced cube-node Pod %s: cubelet log until it ended ====\n%s", name, tail(log, 150))
		show("replaced cube-node Pod "+name+": events", "get", "events", "--field-selector", "involvedObject.name="+name, "--sort-by=.lastTimestamp")
	}
	show("recent events in "+env.Namespace, "get", "events", "--sort-by=.lastTimestamp")
	show("cube-server logs", "logs", "-l", "app.kubernetes.io/component=server", "--tail=200", "--prefix", "--timestamps", "--max-log-requests=10")
	out, err := run(ctx, 30*time.Second, env.CubeBin, "node", "ls", "--server", env.APIURL, "--api-key", env.APIKey)
	if err != nil {
		out = err.Error()
	}
	t.Logf("==== cube node ls ====\n%s", out)
}

// podLog follows the cubelet log of a Pod that is about to be replaced, so
// a failure can show how the old cubelet stopped after the Pod is gone.
type podLog struct {
	mu   sync.Mutex
	name string
	buf  *bytes.Buffer
}

var oldPodLog podLog

func (l *podLog) get() (string, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf == nil {
		return l.name, ""
	}
	return l.name, l.buf.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// follow starts `kubectl logs -f` on pod; it ends by itself when the
// container does, or after 10 minutes.
func (l *podLog) follow(pod string) {
	l.mu.Lock()
	l.name, l.buf = pod, &bytes.Buffer{}
	w := lockedWriter{&l.mu, l.buf}
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	cmd := exec.CommandContext(ctx, "kubectl", "-n", env.Namespace, "logs", "-f", pod, "-c", "cubelet", "--tail=20", "--timestamps")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(w, "kubectl logs -f: %v\n", err)
		cancel()
		return
	}
	go func() {
		defer cancel()
		_ = cmd.Wait()
	}()
}
