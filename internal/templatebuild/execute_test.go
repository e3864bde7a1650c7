package templatebuild

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cube-dev/cube/internal/template"
)

// The built-in recipe decodes as a build spec on base; its last step
// writes the code-interpreter marker with the recipe's key, and Built
// tells a template of this recipe from one of another.
func TestInterpRecipe(t *testing.T) {
	r := InterpRecipe()
	if r.Name != template.InterpName || r.Spec.FromTemplate != BaseTemplate || len(r.Key) != 64 {
		t.Fatalf("recipe %+v", r)
	}
	if p, err := ParseParent(r.Spec); err != nil || p.Template != BaseTemplate || p.Image != "" {
		t.Fatalf("parent %+v %v", p, err)
	}
	all := ""
	for i, st := range r.Spec.Steps {
		if err := st.validate(); err != nil {
			t.Errorf("step %d: %v", i+1, err)
		}
		all += st.Args[0] + "\n"
	}
	for _, p := range []string{"python3-ipykernel", "python3-pandas", "python3-matplotlib", "python3-numpy", "python3-munkres"} {
		if !strings.Contains(all, p) {
			t.Errorf("recipe lacks %s", p)
		}
	}
	last := r.Spec.Steps[len(r.Spec.Steps)-1]
	if last.Type != StepRun || last.Args[1] != "root" || !strings.Contains(last.Args[0], "/"+template.InterpMarker) ||
		!strings.Contains(last.Args[0], recipeLine+r.Key) {
		t.Errorf("last step %+v", last)
	}
	if again := InterpRecipe(); again.Key != r.Key {
		t.Error("the key is not stable")
	}

	// The marker step, run by a shell as the build would, makes a rootfs
	// Built by this recipe; another key is not.
	root := t.TempDir()
	script := strings.ReplaceAll(last.Args[0], "/etc/cube", root+"/etc/cube")
	if out, err := runSh(script); err != nil {
		t.Fatalf("marker step: %v: %s", err, out)
	}
	tpl := template.Template{RootfsPath: root}
	if !template.HasInterp(root) || !r.Built(tpl) {
		t.Fatalf("marker written but not recognised")
	}
	other := r
	other.Key = strings.Repeat("0", 64)
	if other.Built(tpl) || r.Built(template.Template{RootfsPath: t.TempDir()}) {
		t.Error("Built is true for another recipe or no marker")
	}
	// A changed recipe has another key.
	var spec BuildSpec
	if err := json.Unmarshal(interpRecipe, &spec); err != nil {
		t.Fatal(err)
	}
	spec.Steps[0].Args[0] += " python3-scipy"
	if hashJSON([]any{"cube-recipe-v1", spec}) == r.Key {
		t.Error("a changed recipe keeps its key")
	}
}

// collectLog is an Executor.Log.
type collectLog struct {
	mu    sync.Mutex
	lines []string
}

func (c *collectLog) add(level, step, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, step+"|"+level+"|"+msg)
}

func (c *collectLog) text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// Execute runs a recipe without the store: the steps through a real envd,
// the step cache (CacheSteps),
// the target committed with the state as defaults, the sandbox killed; a
// second run resumes from the cache and reruns only the last step; a
// failing step is an error naming it; COPY and images are refused.
func TestExecute(t *testing.T) {
	url, token := startEnvd(t)
	work := t.TempDir()
	f := newFixture(t, &template.Defaults{User: "root", Workdir: work})
	f.sb.envdURL, f.sb.envdToken = url, token
	ex := Executor{Sandboxes: f.sb, Templates: RegistryTemplates{f.reg}, CacheSteps: true}
	var log collectLog
	ex.Log = log.add
	spec := BuildSpec{FromTemplate: "base", Steps: []Step{
		{Type: StepRun, Args: []string{"echo one > one.txt", "root"}},
		{Type: StepEnv, Args: []string{"GREETING", "hi"}},
		{Type: StepRun, Args: []string{`echo "$GREETING" > two.txt`, "root"}},
	}}
	ctx := context.Background()
	if err := ex.Execute(ctx, Target{Name: "recipe-out"}, spec); err != nil {
		t.Fatalf("Execute: %v\n%s", err, log.text())
	}
	if b, err := os.ReadFile(filepath.Join(work, "two.txt")); err != nil || string(b) != "hi\n" {
		t.Errorf("steps did not run: %q %v", b, err)
	}
	created, commits, killed := f.sb.snapshot()
	if len(created) != 1 || created[0] != "base" || len(killed) != 1 {
		t.Fatalf("sandboxes created %v killed %v", created, killed)
	}
	if len(commits) != 3 || !strings.HasPrefix(commits[0].Name, CachePrefix) || !strings.HasPrefix(commits[1].Name, CachePrefix) ||
		commits[2].Name != "recipe-out" {
		t.Fatalf("commits %+v", commits)
	}
	if d := commits[1].Defaults; d.Env["GREETING"] != "hi" || d.User != "root" || d.Workdir != work {
		t.Errorf("target defaults %+v", d)
	}
	for _, want := range []string{"base|info|building template recipe-out from base", "3|info|[3/3] RUN", "finalize|info|build finished in "} {
		if !strings.Contains(log.text(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.text())
		}
	}

	// Again, with the last step changed: step 1 comes from the cache (the
	// ENV step has no layer of its own: it runs again).
	log = collectLog{}
	spec.Steps[2].Args[0] = `echo "$GREETING again" > two.txt`
	if err := ex.Execute(ctx, Target{Name: "recipe-out"}, spec); err != nil {
		t.Fatalf("second Execute: %v", err)
	}
	created, commits, _ = f.sb.snapshot()
	if len(created) != 2 || created[1] != commits[0].Name || len(commits) != 5 || commits[4].Name != "recipe-out" {
		t.Fatalf("rebuild: created %v commits %d", created, len(commits))
	}
	if !strings.Contains(log.text(), "1|info|step 1: cached") || strings.Contains(log.text(), "step 2: cached") {
		t.Errorf("rebuild log:\n%s", log.text())
	}
	if b, _ := os.ReadFile(filepath.Join(work, "two.txt")); string(b) != "hi again\n" {
		t.Errorf("rebuild: two.txt %q", b)
	}

	// Without CacheSteps only the target is committed.
	plain := ex
	plain.CacheSteps = false
	_, before, _ := f.sb.snapshot()
	if err := plain.Execute(ctx, Target{Name: "recipe-plain"}, BuildSpec{FromTemplate: "base", Steps: []Step{
		{Type: StepRun, Args: []string{"true", "root"}}, {Type: StepRun, Args: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, after, _ := f.sb.snapshot(); len(after) != len(before)+1 || after[len(after)-1].Name != "recipe-plain" {
		t.Errorf("without CacheSteps: commits %+v", after[len(before):])
	}

	// A failing step.
	err := ex.Execute(ctx, Target{Name: "recipe-bad"}, BuildSpec{FromTemplate: "base", Steps: []Step{
		{Type: StepRun, Args: []string{"echo broken >&2; exit 4", "root"}}}})
	if err == nil || !strings.Contains(err.Error(), "step 1: command exited with status 4: broken") {
		t.Errorf("failing step: %v", err)
	}
	if _, err := f.reg.Get(ctx, "recipe-bad"); err == nil {
		t.Error("a failed recipe registered its target")
	}
	// What needs the template API.
	if err := ex.Execute(ctx, Target{Name: "x"}, BuildSpec{FromImage: "alpine:3", Steps: []Step{}}); err == nil ||
		!strings.Contains(err.Error(), "fromImage") {
		t.Errorf("fromImage: %v", err)
	}
	err = ex.Execute(ctx, Target{Name: "x"}, BuildSpec{FromTemplate: "base", Steps: []Step{
		{Type: StepCopy, Args: []string{"a", "/a"}, FilesHash: strings.Repeat("b", 64)}}})
	if err == nil || !strings.Contains(err.Error(), "COPY needs uploaded files") {
		t.Errorf("COPY: %v", err)
	}
	if err := ex.Execute(ctx, Target{Name: "x"}, BuildSpec{FromTemplate: "base", Steps: []Step{{Type: "SHELL"}}}); err == nil ||
		!strings.Contains(err.Error(), "unknown step type") {
		t.Errorf("bad step: %v", err)
	}
}

func runSh(script string) ([]byte, error) {
	return exec.Command("/bin/sh", "-c", script).CombinedOutput()
}
