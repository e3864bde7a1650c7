package roles

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/preflight"
)

// serveCubeletAPI serves CubeletService on a wildcard listener the way
// RunCubelet does; GetInfo returns the self-check's current report.
func serveCubeletAPI(t *testing.T, token string, check func() *selfCheck) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	info := func(context.Context) (*nodev1.NodeInfo, error) {
		return &nodev1.NodeInfo{NodeId: "n1", Health: check().current()}, nil
	}
	mux := http.NewServeMux()
	path, h := nodeapi.NewCubeletHandler(nil, info, token)
	mux.Handle(path, h)
	srv := newHTTPServer(mux, slog.Default())
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln
}

func TestSelfCheckSocket(t *testing.T) {
	var check *selfCheck
	ln := serveCubeletAPI(t, "tok", func() *selfCheck { return check })
	check = newListenerCheck(ln.Addr(), "tok", filepath.Join(t.TempDir(), "prep"), slog.Default())
	if !strings.HasPrefix(check.addr, "http://127.0.0.1:") {
		t.Fatalf("wildcard listener probed at %s, want loopback", check.addr)
	}
	if check.current() != nil {
		t.Fatal("report before the first refresh")
	}
	h := check.refresh(context.Background())
	if s := h.GetSocket(); !s.GetServing() || s.GetError() != "" || s.GetCheckedAtUnixMs() == 0 {
		t.Fatalf("serving listener: %+v", s)
	}
	if p := h.GetPreflight(); p.GetState() != string(preflight.PrepNone) {
		t.Fatalf("no prep dir: %+v", p)
	}
	// A listener that answers with another token does not count.
	wrong := newListenerCheck(ln.Addr(), "other", check.prepDir, slog.Default())
	if s := wrong.refresh(context.Background()).GetSocket(); s.GetServing() || !strings.Contains(s.GetError(), "unauthenticated") {
		t.Fatalf("wrong token: %+v", s)
	}
	// Nothing listening.
	ln.Close()
	closed := newListenerCheck(ln.Addr(), "tok", check.prepDir, slog.Default())
	if s := closed.refresh(context.Background()).GetSocket(); s.GetServing() || s.GetError() == "" {
		t.Fatalf("closed listener: %+v", s)
	}
}

func TestSelfCheckReportsPrep(t *testing.T) {
	dir := t.TempDir()
	var check *selfCheck
	ln := serveCubeletAPI(t, "tok", func() *selfCheck { return check })
	check = newListenerCheck(ln.Addr(), "tok", dir, slog.Default())
	at := time.Now().UTC().Truncate(time.Millisecond)
	rep := preflight.Report{Results: []preflight.Result{{Name: "kernel.nftables", Status: preflight.StatusFail, Message: "no nf_tables"}}}
	if err := preflight.WriteFailure(dir, preflight.NewFailure(4, "n1", "v", rep, at)); err != nil {
		t.Fatal(err)
	}
	p := check.refresh(context.Background()).GetPreflight()
	if p.GetState() != "failed" || p.GetGeneration() != 4 || p.GetAtUnixMs() != at.UnixMilli() ||
		len(p.GetFailedChecks()) != 1 || p.GetFailedChecks()[0] != "kernel.nftables: no nf_tables" {
		t.Fatalf("failed prep: %+v", p)
	}
	// GetInfo carries the cached report (and does not probe again).
	ni, err := nodeapi.NewClient(http.DefaultClient, check.addr, "tok").Info(context.Background())
	if err != nil || ni.GetHealth().GetPreflight().GetGeneration() != 4 {
		t.Fatalf("GetInfo health: %+v %v", ni.GetHealth(), err)
	}
}
