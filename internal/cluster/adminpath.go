package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// AdminPrefix is where the node administration API lives: a prefix of
// Cube's own, since the E2B API defines /nodes for its own admin routes.
// Servers also answer at the root (/nodes...) for clients older than it.
const AdminPrefix = "/cube/v1"

// AdminHeader is set on every answer of the node administration API, so a
// client tells "no such node" (404 with it) from "no such route" (404
// without it: a server older than AdminPrefix).
const AdminHeader = "Cube-Admin-Api"

// MountAdmin registers h (NewAdminHandler) on mux under AdminPrefix and at
// the legacy root paths.
func MountAdmin(mux *http.ServeMux, h http.Handler) {
	prefixed := http.StripPrefix(AdminPrefix, h)
	mux.Handle(AdminPrefix+"/nodes", prefixed)
	mux.Handle(AdminPrefix+"/nodes/", prefixed)
	mux.Handle("/nodes", h)
	mux.Handle("/nodes/", h)
}

// SendAdmin sends an administration request for path ("/nodes..."; the
// query included) with API key key to the server at base: under
// AdminPrefix, then at path itself when the server does not know the
// prefix. The caller closes the response body.
func SendAdmin(ctx context.Context, hc *http.Client, base, key, method, path string, body []byte) (*http.Response, error) {
	if !strings.HasPrefix(path, "/nodes") {
		return nil, fmt.Errorf("admin path %q: not under /nodes", path)
	}
	res, err := sendAdmin(ctx, hc, base+AdminPrefix+path, key, method, body)
	if err != nil || res.StatusCode != http.StatusNotFound || res.Header.Get(AdminHeader) != "" {
		return res, err
	}
	io.Copy(io.Discard, io.LimitReader(res.Body, 1<<16))
	res.Body.Close()
	return sendAdmin(ctx, hc, base+path, key, method, body)
}

func sendAdmin(ctx context.Context, hc *http.Client, url, key, method string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return hc.Do(req)
}
