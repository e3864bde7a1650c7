// Package proxy is cube-proxy: it routes sandbox traffic, identified by the
// E2b-Sandbox-Id/E2b-Sandbox-Port headers or a "<port>-<id>.<domain>" Host,
// to the sandbox's address, and passes everything else to the next handler.
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"
)

// Routing headers the E2B SDK puts on every envd request.
const (
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
)

// HeaderTrafficToken carries a sandbox's traffic access token on non-envd
// ports when its public traffic is disabled (E2B network.allowPublicTraffic).
const HeaderTrafficToken = "E2b-Traffic-Access-Token"

// TrafficAuthorizer is implemented by resolvers that guard non-envd ports
// with a per-sandbox traffic access token.
type TrafficAuthorizer interface {
	AuthorizeTraffic(ctx context.Context, id string, port uint16, token string) error
}

// Resolver returns the "ip:port" to dial for a sandbox's guest port; it
// fails when the sandbox is unknown or not running.
type Resolver interface {
	SandboxAddr(ctx context.Context, id string, port uint16) (string, error)
}

// GoneNotifier is implemented by resolvers that announce sandboxes that stop
// serving (killed, expired, paused); the proxy drops their cached addresses.
type GoneNotifier interface {
	OnGone(fn func(id string))
}

// Proxy is the cube-proxy handler.
type Proxy struct {
	resolver Resolver
	next     http.Handler
	domain   string
	cache    *addrCache
	rp       *httputil.ReverseProxy
	log      *slog.Logger
}

type routeKey struct{}

type route struct {
	id   string
	port uint16
	addr string
}

// New returns a Proxy in front of next. domain enables Host routing
// ("" = header routing only). When resolver is a GoneNotifier the proxy
// subscribes to it to invalidate its address cache.
func New(resolver Resolver, next http.Handler, domain string) *Proxy {
	p := &Proxy{resolver: resolver, next: next, domain: domain, cache: newAddrCache(), log: slog.Default().With("component", "cube-proxy")}
	if g, ok := resolver.(GoneNotifier); ok {
		g.OnGone(p.cache.invalidate)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			rt := pr.In.Context().Value(routeKey{}).(route)
			pr.SetURL(&url.URL{Scheme: "http", Host: rt.addr})
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport:     NewTransport(),
		FlushInterval: -1,
		ErrorHandler:  p.upstreamError,
	}
	return p
}

// SetDialer makes the proxy open upstream connections with dial instead of
// a plain dialer, e.g. from the host network namespace when the proxy runs
// in a Pod's (see cubevs.Dataplane.DialContext). Call it before serving.
func (p *Proxy) SetDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	p.rp.Transport.(*http.Transport).DialContext = dial
}

// NewTransport is the upstream transport: pooled keep-alive connections, a
// 5 s dial timeout and no overall deadline (streams are long-lived).
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ExpectContinueTimeout: time.Second,
	}
}

// Protocols is what the shared API/proxy listener should serve: HTTP/1.1
// and cleartext HTTP/2 (h2c). Set it as http.Server.Protocols.
func Protocols() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &p
}

// ServeHTTP routes sandbox traffic or falls through to next.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, ok, err := p.target(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !ok {
		p.next.ServeHTTP(w, r)
		return
	}
	if port != EnvdPort {
		if ta, ok := p.resolver.(TrafficAuthorizer); ok {
			if err := ta.AuthorizeTraffic(r.Context(), id, port, r.Header.Get(HeaderTrafficToken)); err != nil {
				writeError(w, http.StatusForbidden, fmt.Sprintf("sandbox %s port %d: %s header missing or wrong (public traffic is disabled)", id, port, HeaderTrafficToken))
				return
			}
		}
	}
	addr, err := p.resolve(r.Context(), id, port)
	if err != nil {
		p.log.Debug("sandbox not routable", "sandbox", id, "port", port, "err", err)
		writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s is not running", id))
		return
	}
	// Let HTTP/1 clients keep sending the body while the response streams.
	_ = http.NewResponseController(w).EnableFullDuplex()
	ctx := context.WithValue(r.Context(), routeKey{}, route{id: id, port: port, addr: addr})
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// target decides whether r is sandbox traffic: headers first, then Host.
func (p *Proxy) target(r *http.Request) (id string, port uint16, ok bool, err error) {
	if id := r.Header.Get(HeaderSandboxID); id != "" {
		port := uint16(EnvdPort)
		if v := r.Header.Get(HeaderSandboxPort); v != "" {
			n, ok := parsePort(v)
			if !ok {
				return "", 0, false, fmt.Errorf("invalid %s %q: want a port number 1-65535", HeaderSandboxPort, v)
			}
			port = n
		}
		return id, port, true, nil
	}
	id, port, ok = ParseHost(r.Host, p.domain)
	return id, port, ok, nil
}

func (p *Proxy) resolve(ctx context.Context, id string, port uint16) (string, error) {
	if addr, ok := p.cache.get(id, port); ok {
		return addr, nil
	}
	gen := p.cache.generation()
	addr, err := p.resolver.SandboxAddr(ctx, id, port)
	if err != nil {
		return "", err
	}
	p.cache.put(id, port, addr, gen)
	return addr, nil
}

// upstreamError answers a failed upstream exchange with a 502 JSON error
// and drops the cached address so the next request re-resolves.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	rt, _ := r.Context().Value(routeKey{}).(route)
	p.cache.invalidate(rt.id)
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	p.log.Debug("upstream failed", "sandbox", rt.id, "port", rt.port, "err", err)
	writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s is running but port %d is not reachable", rt.id, rt.port))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
