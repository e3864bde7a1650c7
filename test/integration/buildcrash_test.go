package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTemplateBuildSIGKILL kills cube up (SIGKILL) while a template build
// runs a step in its sandbox. After the restart the build is failed with a
// reason that says to start it again, its sandbox is gone (no sandbox, no
// port mapping left), no half-made template is listed or left on disk, and
// the same build started again succeeds.
func TestTemplateBuildSIGKILL(t *testing.T) {
	ctx := context.Background()
	n := newNode(t)
	n.start()

	steps := `[{"type":"RUN","args":["echo started; sleep 600"],"force":false}]`
	tid, bid := n.startBuild(ctx, t, "crash-tpl", steps)
	// Wait until the step runs inside the build sandbox.
	waitFor(t, 2*time.Minute, func() (bool, string) {
		st := n.buildStatus(ctx, t, tid, bid)
		return st.Status == "building" && strings.Contains(st.logText(), "started"), st.String()
	})
	before := n.sandboxDirs(t)
	if len(before) == 0 {
		t.Fatal("no sandbox state on the node while the build runs")
	}

	var staging []string
	for _, name := range n.templateEntries(t) {
		if strings.HasPrefix(name, ".tmp-") {
			staging = append(staging, name)
		}
	}
	n.kill()
	n.start()

	st := n.buildStatus(ctx, t, tid, bid)
	if st.Status != "error" || !strings.Contains(st.Reason.Message, "start the build again") {
		t.Fatalf("build after SIGKILL and restart: %s", st)
	}
	// The build sandbox is killed at start (its id was recorded before the
	// step ran): nothing of it is left on the node.
	waitFor(t, 30*time.Second, func() (bool, string) {
		left := n.sandboxDirs(t)
		return len(left) == 0, fmt.Sprintf("sandbox state left: %v", left)
	})
	if out, _ := n.cubeCLI(append([]string{"node", "mapdump"}, n.flags()...)...); orphanLines(out) != 0 {
		t.Errorf("orphan port mappings after the restart:\n%s", out)
	}
	if names := n.templateNames(ctx, t); strings.Contains(names, "crash-tpl") {
		t.Errorf("GET /templates lists the interrupted template: %s", names)
	}
	// Staging directories of the killed process are swept at start (a
	// build the new process began, e.g. code-interpreter-v1's, may have its own).
	for _, name := range n.templateEntries(t) {
		if strings.Contains(name, "crash-tpl") || (strings.HasPrefix(name, ".tmp-") && slices.Contains(staging, name)) {
			t.Errorf("template store holds %s after the interrupted build and a restart", name)
		}
	}

	// The same template builds afterwards.
	tid2, bid2 := n.startBuild(ctx, t, "crash-tpl", `[{"type":"RUN","args":["echo rebuilt > /rebuilt","root"],"force":false}]`)
	if tid2 != tid {
		t.Errorf("rebuild got template id %s, want the same %s", tid2, tid)
	}
	waitFor(t, 2*time.Minute, func() (bool, string) {
		st := n.buildStatus(ctx, t, tid2, bid2)
		if st.Status == "error" {
			t.Fatalf("rebuild failed: %s", st)
		}
		return st.Status == "ready", st.String()
	})
}

type buildStatus struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Message string `json:"message"`
	} `json:"logEntries"`
	Reason struct {
		Message string `json:"message"`
	} `json:"reason"`
}

func (s buildStatus) logText() string {
	var b strings.Builder
	for _, e := range s.LogEntries {
		b.WriteString(e.Message + "\n")
	}
	return b.String()
}

func (s buildStatus) String() string {
	return fmt.Sprintf("status %q reason %q log:\n%s", s.Status, s.Reason.Message, s.logText())
}

// api sends one JSON request to the REST API and decodes a 2xx answer
// into out (nil: the body is dropped).
func (n *node) api(ctx context.Context, t *testing.T, method, path, body string, out any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequestWithContext(ctx, method, "http://"+n.listen+path, rd)
	req.Header.Set("X-API-Key", n.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := n.httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s: %s", method, path, res.Status, b)
	}
	if out != nil {
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(out); err != nil {
			t.Fatalf("%s %s: decode %q: %v", method, path, b, err)
		}
	}
}

// startBuild requests a build of name from base with steps (the JSON the
// e2b SDK sends) and starts it, as Template.buildInBackground does.
func (n *node) startBuild(ctx context.Context, t *testing.T, name, steps string) (templateID, buildID string) {
	t.Helper()
	var r struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	n.api(ctx, t, http.MethodPost, "/v3/templates", fmt.Sprintf(`{"name":%q}`, name), &r)
	n.api(ctx, t, http.MethodPost, "/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID,
		`{"fromTemplate":"base","steps":`+steps+`,"force":false}`, nil)
	return r.TemplateID, r.BuildID
}

func (n *node) buildStatus(ctx context.Context, t *testing.T, templateID, buildID string) buildStatus {
	t.Helper()
	var st buildStatus
	n.api(ctx, t, http.MethodGet, "/templates/"+templateID+"/builds/"+buildID+"/status", "", &st)
	return st
}

func (n *node) templateNames(ctx context.Context, t *testing.T) string {
	t.Helper()
	var list []struct {
		Aliases []string `json:"aliases"`
	}
	n.api(ctx, t, http.MethodGet, "/templates", "", &list)
	var names []string
	for _, tpl := range list {
		names = append(names, tpl.Aliases...)
	}
	return strings.Join(names, " ")
}

// sandboxDirs lists the sandbox state directories of the node (build
// sandboxes included; warm-pool slots are not sandboxes yet).
func (n *node) sandboxDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(n.dataDir(), "node", "sandboxes"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func (n *node) templateEntries(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(n.dataDir(), "templates"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
