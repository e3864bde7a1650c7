package cluster_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/template"
)

// TestBuiltTemplateRunsOnAnyNode: a template built (committed) on one node
// is shipped as layers: the server copies its top layer into the store,
// and a create on another node that holds the parent (tiny, same digest)
// makes the template there from tiny plus that one layer, the sandbox sees
// the build's file, and deleting the template removes the record so no
// node can fetch it again.
func TestBuiltTemplateRunsOnAnyNode(t *testing.T) {
	c := newCluster(t)
	c.addNode("lay-a")
	c.addNode("lay-b")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	tid, _ := c.buildFromTiny("layered", []map[string]any{
		{"type": "RUN", "args": []string{"echo layer-content > /layer.txt && rm /bin/hostname", "root"}, "force": false}})
	regOf := func(id string) *template.Registry { return template.NewRegistry(filepath.Join(c.dir, id)) }
	builder, other := "lay-a", "lay-b"
	if _, err := regOf(builder).Get(ctx, "layered"); err != nil {
		builder, other = other, builder
	}
	built, err := regOf(builder).Get(ctx, "layered")
	if err != nil {
		t.Fatalf("no node holds the built template: %v", err)
	}
	if len(built.Layers) != 2 {
		t.Fatalf("built template's layers %+v, want tiny's and one more", built.Layers)
	}
	if _, err := regOf(other).Get(ctx, "layered"); err == nil {
		t.Fatalf("%s holds the template before any create there", other)
	}
	if !strings.Contains(c.server.Read(), "committed template shipped as layers") {
		t.Fatalf("server did not ship the committed template:\n%s", c.server.Tail())
	}

	// Creates go to the other node now: it must make the template itself.
	if out, err := c.cube("node", "isolate", builder); err != nil {
		t.Fatalf("isolate %s: %v %s", builder, err, out)
	}
	code, body := c.createRaw("layered")
	if code != http.StatusCreated {
		t.Fatalf("create on %s: %d %s\nnode log:\n%s", other, code, body, c.nodes[other].p.Tail())
	}
	var sb struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal(body, &sb); err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	got, err := regOf(other).Get(ctx, "layered")
	if err != nil {
		t.Fatalf("%s lacks the template after the create: %v", other, err)
	}
	if got.Digest != built.Digest || len(got.Layers) != 2 || got.Layers[1].Digest != built.Layers[1].Digest {
		t.Fatalf("%s made %s %v, the builder has %s %v", other, got.Digest, got.Layers, built.Digest, built.Layers)
	}
	if b, err := os.ReadFile(filepath.Join(got.RootfsPath, "layer.txt")); err != nil || string(b) != "layer-content\n" {
		t.Fatalf("layer.txt on %s: %q %v", other, b, err)
	}
	if _, err := os.Lstat(filepath.Join(got.RootfsPath, "bin", "hostname")); err == nil {
		t.Fatalf("/bin/hostname, removed by the build, is back on %s", other)
	}
	nodeLog := c.nodes[other].p.Read()
	for _, l := range strings.Split(nodeLog+c.server.Read(), "\n") {
		if strings.Contains(l, "fetched template by layers") || strings.Contains(l, "shipped as layers") {
			t.Log(l)
		}
	}
	if strings.Count(nodeLog, "fetched template by layers") != 1 || !strings.Contains(nodeLog, "from=tiny") {
		t.Fatalf("%s's log does not show one layered fetch:\n%s", other, c.nodes[other].p.Tail())
	}
	if got := envdFile(t, c, id, sb.EnvdAccessToken, "/layer.txt"); got != "layer-content\n" {
		t.Fatalf("the sandbox reads /layer.txt as %q", got)
	}

	// Deleting the template (no sandbox of it left) forgets the record:
	// after the nodes' copies go, nothing can make it again.
	c.call(http.MethodDelete, "/sandboxes/"+id, nil, nil, 204)
	c.call(http.MethodDelete, "/templates/"+tid, nil, nil, 204)
	if code, body := c.createRaw("layered"); code/100 != 4 {
		t.Fatalf("create after delete: %d %s", code, body)
	}
}

// envdFile reads a file in a sandbox through the proxy (envd's files API).
func envdFile(t *testing.T, c *cluster, id, token, path string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.url+"/files?path="+path+"&username=root", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s in %s: %d %s", path, id, res.StatusCode, b)
	}
	return string(b)
}

// TestCachedRebuildKeepsStepState: in cluster mode the build service sees
// the step cache through the nodes' reports; a rebuild that starts from a
// cached step goes on with the workdir and env the cached steps set
// (before, node reports carried no defaults: the remaining steps ran in the
// default user's home).
func TestCachedRebuildKeepsStepState(t *testing.T) {
	c := newCluster(t)
	c.addNode("cache-a")
	build := func(last string) buildInfo {
		t.Helper()
		_, st := c.buildFromTiny("stateful", []map[string]any{
			{"type": "USER", "args": []string{"root"}, "force": false},
			{"type": "ENV", "args": []string{"FOO", "bar"}, "force": false},
			{"type": "WORKDIR", "args": []string{"/work"}, "force": false},
			{"type": "RUN", "args": []string{"echo one > one.txt", "root"}, "force": false},
			{"type": "RUN", "args": []string{last, "root"}, "force": false},
		})
		return st
	}
	if logs := build("echo value=$FOO-$(pwd)-first").logs(); !strings.Contains(logs, "value=bar-/work-first") {
		t.Fatalf("first build: no value=bar-/work-first in\n%s", logs)
	}
	logs := build("echo value=$FOO-$(pwd)-second").logs()
	if !strings.Contains(logs, "step 4: cached") {
		t.Fatalf("rebuild did not start from the cache:\n%s", logs)
	}
	if !strings.Contains(logs, "value=bar-/work-second") {
		t.Fatalf("rebuild lost the workdir or env of its cached steps:\n%s", logs)
	}
}

// buildFromTiny builds template name from tiny with steps through the E2B
// build API and waits for it to succeed; it returns the template id and
// the final status.
func (c *cluster) buildFromTiny(name string, steps []map[string]any) (string, buildInfo) {
	c.t.Helper()
	var r struct{ TemplateID, BuildID string }
	c.call(http.MethodPost, "/v3/templates", map[string]any{"name": name}, &r, 202)
	c.call(http.MethodPost, "/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID, map[string]any{"fromTemplate": "tiny", "steps": steps, "force": false}, nil, 202)
	var st buildInfo
	c.waitFor("the build of "+name+" to end", 2*time.Minute, func() bool {
		c.call(http.MethodGet, "/templates/"+r.TemplateID+"/builds/"+r.BuildID+"/status", nil, &st, 200)
		return st.Status == "ready" || st.Status == "error"
	})
	if st.Status != "ready" {
		c.t.Fatalf("build of %s ended %s: %+v\n%s", name, st.Status, st.Reason, st.logs())
	}
	return r.TemplateID, st
}
