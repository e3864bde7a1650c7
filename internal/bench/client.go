package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Client talks to Cube's E2B REST API and, through its proxy, to envd.
type Client struct {
	base   string
	key    string
	hc     *http.Client
	Params CreateBody
}

// CreateBody is the JSON body of POST /v2/sandboxes.
type CreateBody struct {
	TemplateID string `json:"templateID"`
	Timeout    int    `json:"timeout,omitempty"` // seconds
}

// NewClient returns a client for the API at base (http://host:port).
// maxConns bounds the idle keep-alive connections kept per host.
func NewClient(base, key, template string, maxConns int) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: maxConns,
		MaxIdleConns:        maxConns,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{
		base:   strings.TrimRight(base, "/"),
		key:    key,
		hc:     &http.Client{Transport: tr, Timeout: 5 * time.Minute},
		Params: CreateBody{TemplateID: template, Timeout: 3600},
	}
}

// Close drops idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Create creates a sandbox and returns its id once the API answered 201
// (Cube answers only after envd inside the sandbox is listening).
func (c *Client) Create(ctx context.Context) (string, error) {
	body, err := json.Marshal(c.Params)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v2/sandboxes", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	var out struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := c.do(req, http.StatusCreated, &out); err != nil {
		return "", fmt.Errorf("create sandbox: %w", err)
	}
	if out.SandboxID == "" {
		return "", fmt.Errorf("create sandbox: response has no sandboxID")
	}
	return out.SandboxID, nil
}

// Kill deletes a sandbox (DELETE /sandboxes/{id}, 204).
func (c *Client) Kill(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.base+"/sandboxes/"+id, nil)
	if err != nil {
		return err
	}
	if err := c.do(req, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	return nil
}

// Health reports whether GET /health answers 200.
func (c *Client) Health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/health", nil)
	if err != nil {
		return err
	}
	return c.do(req, http.StatusOK, nil)
}

// EnvdHealth asks envd inside sandbox id for /health through Cube's proxy
// (header routing, as the SDK does), expecting 204.
func (c *Client) EnvdHealth(ctx context.Context, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/health", nil)
	if err != nil {
		return err
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	return c.do(req, http.StatusNoContent, nil)
}

func (c *Client) do(req *http.Request, want int, out any) error {
	if req.Header.Get("E2b-Sandbox-Id") == "" {
		req.Header.Set("X-API-Key", c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: status %d: %s", req.Method, req.URL.Path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode %s response: %w", req.URL.Path, err)
		}
	}
	return nil
}
