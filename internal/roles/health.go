package roles

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	nodev1 "github.com/cube-dev/cube/api/gen/node/v1"
	"github.com/cube-dev/cube/internal/nodeapi"
	"github.com/cube-dev/cube/internal/preflight"
)

// selfCheckTimeout bounds the cubelet's call to its own listener.
const selfCheckTimeout = 3 * time.Second

// selfCheck is what the cubelet reports about itself with its registration
// and heartbeats (nodev1.NodeHealth):
//
//   - socket: the cubelet serves CubeletService on a TCP listener (--listen;
//     it has no unix socket: the server, the proxy and the readiness probe
//     all use that port, and shims never call the cubelet). It calls
//     GetInfo on that listener with its own token, through the same handler
//     and authentication the server uses.
//   - preflight: the newest record of the prep directory (`cube prep`:
//     <N>.fingerprint or <N>.failed), re-read at every refresh so a new
//     prep generation shows without restarting the cubelet; "none" when the
//     node runs without the bootstrap.
type selfCheck struct {
	prepDir string
	addr    string // URL dialled, e.g. http://127.0.0.1:7070
	client  *nodeapi.Client
	log     *slog.Logger

	mu   sync.Mutex
	last *nodev1.NodeHealth
}

// newListenerCheck probes a cubelet's CubeletService on its listener.
func newListenerCheck(ln net.Addr, token, prepDir string, log *slog.Logger) *selfCheck {
	addr := "http://" + selfAddr(ln)
	// A new connection per probe: a kept-alive one would answer after the
	// listener itself stopped accepting.
	hc := &http.Client{Timeout: selfCheckTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	return newSelfCheck(addr, nodeapi.NewClient(hc, addr, token), prepDir, log)
}

// newSelfCheck probes CubeletService through client, reported as addr (an
// all-in-one Cube's node is reached in-process).
func newSelfCheck(addr string, client *nodeapi.Client, prepDir string, log *slog.Logger) *selfCheck {
	return &selfCheck{prepDir: prepDir, addr: addr, client: client, log: log}
}

// selfAddr is the listener's address, with 127.0.0.1 for a wildcard IP
// (Go's wildcard listeners are dual-stack, and a Pod may lack ::1).
func selfAddr(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	ip := ta.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port))
}

// refresh runs both checks, logs changes and returns the new report.
func (s *selfCheck) refresh(ctx context.Context) *nodev1.NodeHealth {
	h := &nodev1.NodeHealth{Socket: s.probeSocket(ctx), Preflight: prepToProto(preflight.LatestPrep(s.prepDir))}
	s.mu.Lock()
	prev := s.last
	s.last = h
	s.mu.Unlock()
	s.logChanges(prev, h)
	return h
}

// current is the last report (nil before the first refresh). It never
// probes, so GetInfo (which returns it) cannot recurse into the probe.
func (s *selfCheck) current() *nodev1.NodeHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

func (s *selfCheck) probeSocket(ctx context.Context) *nodev1.SocketHealth {
	ctx, cancel := context.WithTimeout(ctx, selfCheckTimeout)
	defer cancel()
	out := &nodev1.SocketHealth{Address: s.addr, Serving: true}
	if _, err := s.client.Info(ctx); err != nil {
		out.Serving, out.Error = false, err.Error()
	}
	out.CheckedAtUnixMs = time.Now().UnixMilli()
	return out
}

func (s *selfCheck) logChanges(prev, cur *nodev1.NodeHealth) {
	sock, prep := cur.GetSocket(), cur.GetPreflight()
	if prev == nil || prev.GetSocket().GetServing() != sock.GetServing() {
		if sock.GetServing() {
			s.log.Info("self-check: cubelet API answers", "address", sock.GetAddress())
		} else {
			s.log.Warn("self-check: cubelet API does not answer", "address", sock.GetAddress(), "err", sock.GetError())
		}
	}
	pp := prev.GetPreflight()
	if prev == nil || pp.GetState() != prep.GetState() || pp.GetGeneration() != prep.GetGeneration() || pp.GetAtUnixMs() != prep.GetAtUnixMs() {
		lvl := slog.LevelInfo
		if prep.GetState() == string(preflight.PrepFailed) || prep.GetState() == string(preflight.PrepInvalid) {
			lvl = slog.LevelWarn
		}
		s.log.Log(context.Background(), lvl, "self-check: node prep", "state", prep.GetState(), "generation", prep.GetGeneration(),
			"failed", prep.GetFailedChecks(), "detail", prep.GetDetail())
	}
}

func prepToProto(p preflight.PrepStatus) *nodev1.PreflightHealth {
	out := &nodev1.PreflightHealth{State: string(p.State), Generation: int32(p.Generation),
		FailedChecks: p.Failed, Warnings: int32(p.Warnings), Detail: p.Detail}
	if !p.At.IsZero() {
		out.AtUnixMs = p.At.UnixMilli()
	}
	return out
}
