package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/template"
)

// TestTemplateDistribution: a template registered only on the server is
// fetched by the node a sandbox lands on, verified by digest, cached there
// (reported in heartbeats, not fetched twice) and serves envd through the
// proxy; a template whose published digest does not match its content is
// refused and leaves nothing on the node.
func TestTemplateDistribution(t *testing.T) {
	c := newCluster(t)
	c.addNode("node-d")
	serverData := filepath.Join(c.dir, "server")
	nodeTemplates := template.NewRegistry(filepath.Join(c.dir, "node-d"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c.serverTemplate("tiny2")
	if _, err := nodeTemplates.Get(ctx, "tiny2"); err == nil {
		t.Fatal("node has tiny2 before any create")
	}
	want, err := template.NewRegistry(serverData).Get(ctx, "tiny2")
	if err != nil {
		t.Fatal(err)
	}

	var ids []string
	for range 2 {
		code, body := c.createRaw("tiny2")
		if code != http.StatusCreated {
			t.Fatalf("create tiny2: %d %s\nnode log:\n%s", code, body, c.nodes["node-d"].p.Tail())
		}
		var sb struct {
			SandboxID string `json:"sandboxID"`
		}
		json.Unmarshal(body, &sb)
		ids = append(ids, sb.SandboxID)
	}
	for _, id := range ids {
		if code := c.envdHealth(id); code != http.StatusNoContent {
			t.Fatalf("envd of %s through the proxy: %d", id, code)
		}
	}
	got, err := nodeTemplates.Get(ctx, "tiny2")
	if err != nil {
		t.Fatalf("node lacks tiny2 after the create: %v", err)
	}
	if got.Digest != want.Digest || got.Source != template.StreamSource {
		t.Fatalf("node's tiny2 %+v, server digest %s", got, want.Digest)
	}
	nodeLog, _ := os.ReadFile(c.nodes["node-d"].p.Log)
	if n := strings.Count(string(nodeLog), "template fetched"); n != 1 {
		t.Fatalf("node fetched tiny2 %d times, want once (then cached)", n)
	}
	c.waitFor("tiny2 in node-d's heartbeat", 20*time.Second, func() bool {
		var ns []struct {
			ID        string   `json:"id"`
			Templates []string `json:"templates"`
		}
		c.call(http.MethodGet, "/nodes", nil, &ns, 200)
		for _, n := range ns {
			if n.ID == "node-d" && strings.Contains(strings.Join(n.Templates, ","), "tiny2") {
				return true
			}
		}
		return false
	})

	// Tampered: the server's metadata claims a digest its rootfs lacks.
	c.serverTemplate("tiny3")
	meta := filepath.Join(serverData, "templates", "tiny3", "template.json")
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["digest"] = "sha256:" + strings.Repeat("0", 64)
	b, _ = json.Marshal(m)
	if err := os.WriteFile(meta, b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, body := c.createRaw("tiny3")
	if code != http.StatusConflict || !strings.Contains(string(body), "digest") {
		t.Fatalf("create of tampered tiny3: %d %s, want 409 naming the digest", code, body)
	}
	if _, err := nodeTemplates.Get(ctx, "tiny3"); err == nil {
		t.Fatal("tampered tiny3 registered on the node")
	}
	ents, _ := os.ReadDir(nodeTemplates.Dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Fatalf("staging left on the node: %s", e.Name())
		}
	}
	// Unknown on the server and every node: refused by the API (its E2B
	// mapping answers 400) without a fetch.
	if code, body := c.createRaw("nowhere"); code/100 != 4 || !strings.Contains(string(body), "not found") {
		t.Fatalf("create of an unknown template: %d %s", code, body)
	}
}

// serverTemplate registers a busybox template called name in the server's
// data dir only.
func (c *cluster) serverTemplate(name string) {
	c.t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "cube"), "template", "create", name,
		"--from-dir", busyboxRootfs(c.t), "--data-dir", filepath.Join(c.dir, "server")).CombinedOutput()
	if err != nil {
		c.t.Fatalf("template create %s on the server: %v\n%s", name, err, out)
	}
}

// createRaw asks the API for a sandbox of tpl and returns status and body.
func (c *cluster) createRaw(tpl string) (int, []byte) {
	c.t.Helper()
	b, _ := json.Marshal(map[string]any{"templateID": tpl, "timeout": 600})
	req, _ := http.NewRequest(http.MethodPost, c.url+"/v2/sandboxes", bytes.NewReader(b))
	req.Header.Set("X-API-Key", c.key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("create %s: %v", tpl, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, data
}
