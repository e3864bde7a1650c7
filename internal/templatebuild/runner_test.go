package templatebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	envdserver "github.com/cube-dev/cube/internal/envd"
	"github.com/cube-dev/cube/internal/template"
)

// startEnvd serves a real envd in-process, as the build sandbox's would
// be; the commands run on this host as root, so the steps below only touch
// temporary directories (and never USER, which may create accounts).
func startEnvd(t *testing.T) (url, token string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: envd runs processes as the requested user")
	}
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:"+dir+":/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(group, []byte("root:x:0:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := envdserver.Config{AccessToken: "build-token", DefaultUser: "root", PasswdFile: passwd, GroupFile: group,
		EnvVars: map[string]string{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
	srv := envdserver.NewServer(cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Close(ctx)
		hs.Close()
	})
	return hs.URL, cfg.AccessToken
}

func (f *fixture) upload(t *testing.T, hash string, entries ...entry) {
	t.Helper()
	if err := f.svc.files.put(context.Background(), hash, bytes.NewReader(makeTar(t, true, entries...))); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) build(t *testing.T, spec BuildSpec) (BuildInfo, []LogEntry) {
	t.Helper()
	req, err := f.svc.RequestBuild(context.Background(), BuildRequest{Name: "app", CPUCount: 2, MemoryMB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.StartBuild(context.Background(), req.TemplateID, req.BuildID, spec); err != nil {
		t.Fatal(err)
	}
	return f.wait(t, req.TemplateID, req.BuildID)
}

func messages(logs []LogEntry) string {
	var b strings.Builder
	for _, e := range logs {
		fmt.Fprintf(&b, "%s|%s|%s\n", e.Step, e.Level, e.Message)
	}
	return b.String()
}

// A build runs its steps through a real envd with the E2B semantics, logs
// them with step labels, caches each step, commits the final template with
// the state as defaults, and kills its sandbox; a rebuild with only the
// last step changed reruns only that step; a failing step fails the build
// with its exit status and output.
func TestRunnerWithEnvd(t *testing.T) {
	url, token := startEnvd(t)
	work := t.TempDir()
	f := newFixture(t, &template.Defaults{User: "root", Workdir: work, Env: map[string]string{"FROM_PARENT": "p"}})
	f.sb.envdURL, f.sb.envdToken = url, token
	hash := strings.Repeat("a", 64)
	f.upload(t, hash, entry{name: "conf/", typ: tar.TypeDir}, entry{name: "conf/app.ini", typ: tar.TypeReg, body: "key=value\n"})
	steps := []Step{
		{Type: StepRun, Args: []string{`echo "hello $FROM_PARENT"; pwd`}},
		{Type: StepEnv, Args: []string{"FOO", "bar", "BAZ", "$FOO-baz with spaces"}},
		{Type: StepWorkdir, Args: []string{"sub/dir"}},
		{Type: StepCopy, Args: []string{"conf", "etc/", "", "0640"}, FilesHash: hash},
		{Type: StepRun, Args: []string{`echo "$BAZ" > out.txt; cat etc/app.ini`, "root"}},
	}
	spec := BuildSpec{FromTemplate: "base", Steps: steps, StartCmd: "sleep infinity", ReadyCmd: "true"}
	info, logs := f.build(t, spec)
	text := messages(logs)
	if info.Status != "ready" {
		t.Fatalf("build %+v\n%s", info, text)
	}
	for _, want := range []string{
		"base|info|building template app from base\n",
		"1|info|[1/5] RUN echo \"hello $FROM_PARENT\"; pwd\n", "1|info|hello p\n", "1|info|" + work + "\n",
		"4|info|[4/5] COPY conf etc/\n", "5|info|key=value\n", "finalize|info|build finished in ",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("log lacks %q:\n%s", want, text)
		}
	}
	wd := filepath.Join(work, "sub/dir")
	if b, err := os.ReadFile(filepath.Join(wd, "out.txt")); err != nil || string(b) != "bar-baz with spaces\n" {
		t.Errorf("ENV expansion: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(wd, "etc/app.ini")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("COPY: %v %v", fi, err)
	}
	created, commits, killed := f.sb.snapshot()
	if len(created) != 1 || created[0] != "base" || len(killed) != 1 || killed[0] != "sbx-1" {
		t.Fatalf("sandboxes created %v killed %v", created, killed)
	}
	// Steps 1, 3, 4 and 5 are cached (ENV changes no file), then the final commit.
	if len(commits) != 5 || !strings.HasPrefix(commits[0].Name, CachePrefix) || commits[4].Name != "app" {
		t.Fatalf("commits %+v", commits)
	}
	final := commits[4]
	if final.CPUCount != 2 || final.MemoryMB != 1024 || final.Defaults.User != "root" || final.Defaults.Workdir != wd ||
		final.Defaults.Env["BAZ"] != "bar-baz with spaces" || final.Defaults.Env["FROM_PARENT"] != "p" ||
		final.Defaults.StartCmd != "sleep infinity" || final.Defaults.ReadyCmd != "true" {
		t.Fatalf("final commit %+v", final)
	}
	list, _ := f.svc.List(context.Background())
	for _, s := range list {
		if strings.HasPrefix(s.TemplateID, CachePrefix) {
			t.Fatalf("the build cache is listed: %+v", list)
		}
	}

	// Only the last step changed: steps 1-4 come from the cache.
	steps[4].Args = []string{`echo "$BAZ" > out2.txt`}
	info, logs = f.build(t, BuildSpec{FromTemplate: "base", Steps: steps})
	text = messages(logs)
	if info.Status != "ready" {
		t.Fatalf("rebuild %+v\n%s", info, text)
	}
	for i := 1; i <= 4; i++ {
		if !strings.Contains(text, fmt.Sprintf("%d|info|step %d: cached\n", i, i)) {
			t.Errorf("step %d not cached:\n%s", i, text)
		}
	}
	if strings.Contains(text, "hello p") {
		t.Errorf("step 1 ran again:\n%s", text)
	}
	if b, err := os.ReadFile(filepath.Join(wd, "out2.txt")); err != nil || string(b) != "bar-baz with spaces\n" {
		t.Errorf("state restored from the cache: %q %v", b, err)
	}
	created, _, _ = f.sb.snapshot()
	if len(created) != 2 || created[1] != cacheName(cacheKeys(parentKeyOf(t, f), steps)[4]) {
		t.Errorf("rebuild started from %v", created)
	}

	// force on step 2 reruns from step 2 on; top-level force reruns all.
	steps[1].Force = true
	_, logs = f.build(t, BuildSpec{FromTemplate: "base", Steps: steps})
	if text = messages(logs); !strings.Contains(text, "1|info|step 1: cached") || strings.Contains(text, "step 2: cached") {
		t.Errorf("step force:\n%s", text)
	}
	_, logs = f.build(t, BuildSpec{FromTemplate: "base", Steps: steps, Force: true})
	if text = messages(logs); strings.Contains(text, "cached\n") || !strings.Contains(text, "hello p") {
		t.Errorf("top-level force:\n%s", text)
	}

	// A failing command fails the build with its status and output (the
	// order of stdout and stderr lines is not defined: two pipes).
	info, logs = f.build(t, BuildSpec{FromTemplate: "base", Steps: []Step{
		{Type: StepRun, Args: []string{"true"}},
		{Type: StepRun, Args: []string{"echo first; echo oops >&2; exit 3"}},
		{Type: StepRun, Args: []string{"echo never"}},
	}})
	if info.Status != "error" || info.Reason == nil || info.Reason.Step != "2" ||
		!strings.HasPrefix(info.Reason.Message, "step 2: command exited with status 3: ") ||
		!strings.Contains(info.Reason.Message, "first") || !strings.Contains(info.Reason.Message, "oops") {
		t.Fatalf("failed build %+v\n%s", info.Reason, messages(logs))
	}
	if strings.Contains(messages(logs), "never") {
		t.Error("a step after the failure ran")
	}
	if _, _, killed = f.sb.snapshot(); len(killed) != 5 {
		t.Errorf("killed %v; every build sandbox must be killed", killed)
	}
}

func parentKeyOf(t *testing.T, f *fixture) string {
	t.Helper()
	p, err := RegistryTemplates{f.reg}.Get(context.Background(), "base")
	if err != nil {
		t.Fatal(err)
	}
	return parentKey(p)
}
