package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/master"
	"github.com/cube-dev/cube/internal/nodeproto"
)

// listenNode is a Node whose sandboxes are real HTTP servers on 127.0.0.1,
// so the proxy really proxies.
type listenNode struct {
	mu        sync.Mutex
	servers   map[string]*httptest.Server
	paused    map[string]bool
	createErr error
	release   chan struct{} // unblocks /stream after its first chunk
}

func newListenNode() *listenNode {
	return &listenNode{servers: map[string]*httptest.Server{}, paused: map[string]bool{}, release: make(chan struct{})}
}

func sandboxHandler(id string, release <-chan struct{}) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/whoami", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s|%s", id, r.Header.Get("Authorization"), r.Header.Get("X-Access-Token"))
	})
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(5 * time.Second):
			fmt.Fprint(w, "TIMEOUT\n")
			return
		}
		fmt.Fprint(w, "second\n")
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	})
	return mux
}

func (n *listenNode) CreateSandbox(ctx context.Context, req nodeproto.CreateRequest) (nodeproto.Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.createErr != nil {
		return nodeproto.Sandbox{}, n.createErr
	}
	n.servers[req.SandboxID] = httptest.NewServer(sandboxHandler(req.SandboxID, n.release))
	return nodeproto.Sandbox{ID: req.SandboxID, Template: req.Template, IP: netip.MustParseAddr("127.0.0.1"),
		EnvdVersion: "0.2.4", CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 4096, StartedAt: time.Now()}, nil
}

func (n *listenNode) KillSandbox(ctx context.Context, id string) error {
	n.mu.Lock()
	srv, ok := n.servers[id]
	delete(n.servers, id)
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	srv.CloseClientConnections()
	srv.Close()
	return nil
}

func (n *listenNode) alive(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.servers[id]
	return ok
}

func (n *listenNode) SandboxAddr(ctx context.Context, id string, port uint16) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	srv, ok := n.servers[id]
	if !ok {
		return "", fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if port == 1 { // a port nothing listens on
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close()
		return addr, nil
	}
	return srv.Listener.Addr().String(), nil
}

func (n *listenNode) SandboxMetrics(ctx context.Context, id string) (nodeproto.Metrics, error) {
	return nodeproto.Metrics{Timestamp: time.Now(), CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 1 << 20, MemTotal: 1 << 30}, nil
}

func (n *listenNode) PauseSandbox(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.paused[id] = true
	return nil
}

func (n *listenNode) ResumeSandbox(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.paused, id)
	return nil
}

func (n *listenNode) Template(ctx context.Context, name string) (master.TemplateInfo, error) {
	switch name {
	case "base", "code-interpreter-v1":
		return master.TemplateInfo{Name: name, CPUCount: 2, MemoryMB: 1024, DiskSizeMB: 4096}, nil
	}
	return master.TemplateInfo{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
}

func (n *listenNode) closeAll() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.servers {
		s.CloseClientConnections()
		s.Close()
	}
}
