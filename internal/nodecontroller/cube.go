package nodecontroller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/cluster"
	"github.com/cube-dev/cube/internal/errdefs"
)

// Cube is what the controller needs from a Cube server's node registry.
// Errors carry errdefs kinds; a node the server does not know is
// errdefs.ErrNotFound.
type Cube interface {
	Isolate(ctx context.Context, id string) error
	Uncordon(ctx context.Context, id string) error
	Drain(ctx context.Context, id string, policy cluster.DrainPolicy, grace time.Duration) error
	Node(ctx context.Context, id string) (Status, error)
	Delete(ctx context.Context, id string, force bool) error
}

// Status is the part of a Cube node's status the controller acts on.
type Status struct {
	State     cluster.State
	Sandboxes int
	Inflight  int
	// Drain is nil unless a drain was started (it stays, with phase
	// "done", until the node is uncordoned or deleted).
	Drain *cluster.DrainState
}

// HTTPCube talks to the node administration API of `cube server`
// (internal/cluster.NewAdminHandler).
type HTTPCube struct {
	base string
	key  string
	hc   *http.Client
}

var _ Cube = (*HTTPCube)(nil)

// NewHTTPCube returns a client for the server at serverURL (e.g.
// http://cube-server:3000) authenticating with apiKey. hc nil means a
// client with a 30 s timeout.
func NewHTTPCube(serverURL, apiKey string, hc *http.Client) (*HTTPCube, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("cube server url %q: want http(s)://host[:port]: %w", serverURL, errdefs.ErrInvalidArgument)
	}
	if apiKey == "" {
		return nil, fmt.Errorf("cube server api key is empty: set --api-key or CUBE_API_KEY: %w", errdefs.ErrInvalidArgument)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	return &HTTPCube{base: strings.TrimRight(serverURL, "/"), key: apiKey, hc: hc}, nil
}

// Isolate stops scheduling onto the node.
func (c *HTTPCube) Isolate(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, nodePath(id)+"/isolate", nil, nil)
}

// Uncordon makes the node schedulable and cancels a drain.
func (c *HTTPCube) Uncordon(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, nodePath(id)+"/uncordon", nil, nil)
}

// Drain isolates the node and starts a drain; repeating it with the same
// policy keeps the original start.
func (c *HTTPCube) Drain(ctx context.Context, id string, policy cluster.DrainPolicy, grace time.Duration) error {
	gs := int((grace + time.Second - 1) / time.Second)
	body := cluster.DrainRequest{Policy: policy, GraceSeconds: &gs}
	return c.do(ctx, http.MethodPost, nodePath(id)+"/drain", body, nil)
}

// Node returns the node's status.
func (c *HTTPCube) Node(ctx context.Context, id string) (Status, error) {
	var st cluster.NodeStatus
	if err := c.do(ctx, http.MethodGet, nodePath(id), nil, &st); err != nil {
		return Status{}, err
	}
	return Status{State: st.State, Sandboxes: st.Sandboxes, Inflight: st.Inflight, Drain: st.Drain}, nil
}

// Delete deregisters the node; force also forgets its sandboxes.
func (c *HTTPCube) Delete(ctx context.Context, id string, force bool) error {
	p := nodePath(id)
	if force {
		p += "?force=true"
	}
	return c.do(ctx, http.MethodDelete, p, nil, nil)
}

func nodePath(id string) string { return "/nodes/" + url.PathEscape(id) }

func (c *HTTPCube) do(ctx context.Context, method, path string, body, out any) error {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
	}
	res, err := cluster.SendAdmin(ctx, c.hc, c.base, c.key, method, path, b)
	if err != nil {
		return fmt.Errorf("cube %s %s: %v: %w", method, path, err, errdefs.ErrUnavailable)
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		var e struct{ Message string }
		json.NewDecoder(io.LimitReader(res.Body, 1<<16)).Decode(&e)
		return fmt.Errorf("cube %s %s: %s: %s: %w", method, path, res.Status, e.Message, kindOf(res.StatusCode))
	}
	if out == nil || res.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return fmt.Errorf("cube %s %s: decode: %v: %w", method, path, err, errdefs.ErrUnavailable)
	}
	return nil
}

// kindOf maps the server's HTTP status back to the error kind it came from
// (the inverse of errdefs.HTTPStatus).
func kindOf(code int) error {
	switch code {
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case http.StatusConflict:
		return errdefs.ErrConflict
	case http.StatusPreconditionFailed:
		return errdefs.ErrFailedPrecondition
	case http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	case http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusNotImplemented:
		return errdefs.ErrNotImplemented
	default:
		return errdefs.ErrUnavailable
	}
}
