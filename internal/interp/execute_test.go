package interp

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/envd"
)

func TestStateAndStreams(t *testing.T) {
	s := startServer(t, Config{})
	if ex := s.code("x = 41"); ex.err != nil || len(ex.results) != 0 {
		t.Fatalf("x = 41: %+v", ex)
	}
	ex := s.code("x + 1")
	if ex.text() != "42" || ex.executionCount != 2 {
		t.Fatalf("x + 1: text %q count %d, want 42 and 2 (%v)", ex.text(), ex.executionCount, ex.lines)
	}
	ex = s.code("import sys\nprint('out1')\nsys.stdout.flush()\nprint('err1', file=sys.stderr)\nsys.stderr.flush()\nprint('out2')\n'done'")
	if got := strings.Join(ex.stdout, ""); got != "out1\nout2\n" {
		t.Errorf("stdout %q", got)
	}
	if got := strings.Join(ex.stderr, ""); got != "err1\n" {
		t.Errorf("stderr %q", got)
	}
	// The repr of a string loses its quotes, as with upstream's server.
	if ex.text() != "done" {
		t.Errorf("text %q, want done", ex.text())
	}
	types := ex.types()
	if types[0] != "number_of_executions" || types[len(types)-1] != "end_of_execution" {
		t.Errorf("line order %v", types)
	}
	if i, j := slices.Index(types, "stderr"), slices.Index(types, "result"); i < 0 || j < i {
		t.Errorf("stderr before the result expected: %v", types)
	}
}

func TestResultFormats(t *testing.T) {
	s := startServer(t, Config{})
	ex := s.code(`from IPython.display import display, HTML, Markdown, Latex, SVG, JSON, Javascript
display(HTML("<b>h</b>"))
display(Markdown("# m"))
display(Latex(r"$\alpha$"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'))
display(JSON({"k": [1, 2]}))
display(Javascript("console.log(1)"))
7`)
	if ex.err != nil {
		t.Fatalf("error: %v", ex.err)
	}
	want := []string{"html", "markdown", "latex", "svg", "json", "javascript"}
	if len(ex.results) != len(want)+1 {
		t.Fatalf("%d results, want %d: %v", len(ex.results), len(want)+1, ex.results)
	}
	for i, field := range want {
		r := ex.results[i]
		if r[field] == nil || r["is_main_result"] != false {
			t.Errorf("display %d: no %s or main: %v", i, field, r)
		}
	}
	if j, ok := ex.results[4]["json"].(map[string]any); !ok || j["k"] == nil {
		t.Errorf("json result is not an object: %v", ex.results[4]["json"])
	}
	if ex.text() != "7" || ex.results[len(want)]["is_main_result"] != true {
		t.Errorf("main result: %v", ex.results[len(want)])
	}

	ex = s.code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
	if html, _ := ex.results[0]["html"].(string); !strings.Contains(html, "<table") || ex.text() == "" {
		t.Errorf("DataFrame: want html table and text, got %v", ex.results)
	}
	ex = s.code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
	if len(ex.results) != 1 {
		t.Fatalf("matplotlib: %d results: %v (err %v)", len(ex.results), ex.results, ex.err)
	}
	if png, _ := ex.results[0]["png"].(string); !strings.HasPrefix(png, "iVBORw0KGgo") { // base64 of the PNG magic
		t.Errorf("matplotlib: no png: %v", ex.results[0])
	}
}

var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

func TestError(t *testing.T) {
	s := startServer(t, Config{})
	ex := s.code("def f():\n    raise ValueError('bad value')\nprint('before')\nf()")
	if ex.err == nil {
		t.Fatalf("no error: %v", ex.lines)
	}
	if ex.err["name"] != "ValueError" || ex.err["value"] != "bad value" {
		t.Errorf("error %v", ex.err)
	}
	// Colored by IPython, as upstream's server passes it on.
	if tb, _ := ex.err["traceback"].(string); !strings.Contains(ansi.ReplaceAllString(tb, ""), "raise ValueError('bad value')") {
		t.Errorf("traceback without the raising line: %q", tb)
	}
	if n := slices.Index(ex.types(), "error"); n < 0 || slices.Index(ex.types(), "stdout") > n {
		t.Errorf("order %v", ex.types())
	}
	// One error line, not one from iopub and one from the reply.
	if n := len(slices.DeleteFunc(ex.types(), func(s string) bool { return s != "error" })); n != 1 {
		t.Errorf("%d error lines", n)
	}
	if ex := s.code("1 + 1"); ex.text() != "2" {
		t.Errorf("after an error: %v", ex.lines)
	}
}

// A client that gives up (runCode's timeoutMs aborts the request) gets the
// kernel interrupted: an endless loop stops, state survives, the next
// execution runs.
func TestTimeoutInterrupts(t *testing.T) {
	s := startServer(t, Config{})
	s.code("y = 5")
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	status, _ := s.do(ctx, "POST", "/execute", map[string]any{"code": "while True:\n    pass"}, nil)
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	ex := s.code("y * 2")
	if ex.text() != "10" {
		t.Fatalf("after interrupt: %v", ex.lines)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("interrupt + next execution took %s", took)
	}
}

// A kernel that exits from inside is an error line; the context's next
// execution gets a new kernel (state lost).
func TestKernelDies(t *testing.T) {
	s := startServer(t, Config{})
	s.code("z = 1")
	ex := s.code("import os\nos._exit(3)")
	if ex.err == nil || ex.err["name"] != "KernelDied" || !strings.Contains(ex.err["value"].(string), "exit status 3") {
		t.Fatalf("want KernelDied error, got %v", ex.lines)
	}
	ex = s.code("z")
	if ex.err == nil || ex.err["name"] != "NameError" {
		t.Errorf("state survived the kernel: %v", ex.lines)
	}
	if ex := s.code("2 + 2"); ex.text() != "4" {
		t.Errorf("new kernel: %v", ex.lines)
	}
}

// env_vars apply to one execution; the sandbox's env vars (from envd, with
// the caller's token) to all.
func TestEnvVars(t *testing.T) {
	e := envd.NewServer(envd.Config{AccessToken: "tok", EnvVars: map[string]string{"GLOBAL": "g", "SHADOW": "global"}})
	envdSrv := httptest.NewServer(e)
	t.Cleanup(envdSrv.Close)
	s := startServer(t, Config{EnvdURL: envdSrv.URL})
	get := "import os\n(os.environ.get('GLOBAL'), os.environ.get('SHADOW'), os.environ.get('ONCE'))"
	ex := s.run(map[string]any{"code": get, "env_vars": map[string]string{"ONCE": "1", "SHADOW": "mine"}})
	if ex.text() != "('g', 'mine', '1')" {
		t.Errorf("with env_vars: %q (%v)", ex.text(), ex.lines)
	}
	if ex := s.code(get); ex.text() != "('g', 'global', None)" {
		t.Errorf("after: %q (%v)", ex.text(), ex.lines)
	}
	// The silent env executions do not count.
	if ex := s.code("1"); ex.executionCount != 3 {
		t.Errorf("execution count %d, want 3", ex.executionCount)
	}
}

// Kernels run as the configured user (in a sandbox: "user", as envd's
// commands), with that user's home as the default cwd.
func TestRunsAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a kernel as another user")
	}
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} { // t.TempDir makes them 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("kuser:x:65534:65534::"+home+":/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, Config{User: "kuser", PasswdFile: passwd, GroupFile: filepath.Join(dir, "group"), Cwd: home, RunDir: dir})
	ex := s.code("import os\nprint(os.getuid(), os.getcwd(), os.environ['HOME'])")
	if want := fmt.Sprintf("65534 %s %s\n", home, home); strings.Join(ex.stdout, "") != want {
		t.Errorf("got %q, want %q (%v)", ex.stdout, want, ex.lines)
	}
}
