package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/nodeproto"
	"github.com/cube-dev/cube/internal/store"
	"github.com/cube-dev/cube/internal/template"
)

// testSandboxes stands in for the node side, which this package does not
// own: build sandboxes reach the envd at envdURL (a real envd in the
// runner tests), and a commit registers a real template in reg carrying
// the committed defaults (its rootfs holds a marker file only).
type testSandboxes struct {
	reg       *template.Registry
	envdURL   string
	envdToken string
	createErr error
	// envdBlock, when set, holds Envd (the build, after its sandbox is
	// recorded) until it is closed or the build's context ends.
	envdBlock chan struct{}

	mu      sync.Mutex
	created []string // parents
	commits []nodeproto.CommitRequest
	killed  []string
}

func (s *testSandboxes) CreateBuildSandbox(ctx context.Context, parent string, cpu, mem int) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.createErr != nil {
		return "", s.createErr
	}
	s.created = append(s.created, parent)
	return fmt.Sprintf("sbx-%d", len(s.created)), nil
}

func (s *testSandboxes) Envd(ctx context.Context, id string) (*http.Client, string, string, error) {
	if s.envdBlock != nil {
		select {
		case <-s.envdBlock:
		case <-ctx.Done():
			return nil, "", "", ctx.Err()
		}
	}
	return http.DefaultClient, s.envdURL, s.envdToken, nil
}

func (s *testSandboxes) CommitSandbox(ctx context.Context, req nodeproto.CommitRequest) error {
	s.mu.Lock()
	s.commits = append(s.commits, req)
	s.mu.Unlock()
	d := req.Defaults
	_, err := s.reg.Register(ctx, req.Name, template.Meta{CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, Source: "commit:" + req.SandboxID,
		Defaults: &template.Defaults{Env: d.Env, Workdir: d.Workdir, User: d.User, StartCmd: d.StartCmd, ReadyCmd: d.ReadyCmd}},
		func(ctx context.Context, rootfs string) error {
			return os.WriteFile(filepath.Join(rootfs, "committed-from"), []byte(req.SandboxID), 0o644)
		})
	return err
}

func (s *testSandboxes) KillSandbox(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killed = append(s.killed, id)
	return nil
}

func (s *testSandboxes) snapshot() (created []string, commits []nodeproto.CommitRequest, killed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.created...), append([]nodeproto.CommitRequest(nil), s.commits...), append([]string(nil), s.killed...)
}

type fixture struct {
	svc *Service
	st  *store.SQLite
	reg *template.Registry
	sb  *testSandboxes
	dir string
	// images, when set before start, imports the images of builds fromImage.
	images Images
}

// newFixture opens a real SQLite store and template registry in a temp
// dir, registers the parent template `base` with defaults, and starts the
// service.
func newFixture(t *testing.T, defaults *template.Defaults) *fixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "server.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg := &template.Registry{Dir: filepath.Join(dir, "templates"), CacheDir: filepath.Join(dir, "cache")}
	if _, err := reg.Register(ctx, "base", template.Meta{Source: "test", Defaults: defaults}, func(ctx context.Context, rootfs string) error {
		return os.WriteFile(filepath.Join(rootfs, "base-marker"), nil, 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{st: st, reg: reg, sb: &testSandboxes{reg: reg}, dir: dir}
	f.svc = f.start(t)
	return f
}

func (f *fixture) start(t *testing.T) *Service {
	t.Helper()
	svc, err := New(context.Background(), Config{Store: f.st, Sandboxes: f.sb, Templates: RegistryTemplates{f.reg},
		FilesDir: filepath.Join(f.dir, "template-files"), Secret: []byte("test-secret"), Images: f.images,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	return svc
}

// wait polls Status until the build ends and returns the last answer and
// every log entry, paging by offset as the SDK does.
func (f *fixture) wait(t *testing.T, tid, bid string) (BuildInfo, []LogEntry) {
	t.Helper()
	var all []LogEntry
	deadline := time.Now().Add(60 * time.Second)
	for {
		info, err := f.svc.Status(context.Background(), tid, bid, len(all))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, info.LogEntries...)
		if (info.Status == "ready" || info.Status == "error") && len(info.LogEntries) == 0 {
			return info, all
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s still %s; logs %v", bid, info.Status, all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRequestAndStartValidation(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	a, err := f.svc.RequestBuild(ctx, BuildRequest{Name: "Web", CPUCount: 2, MemoryMB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.svc.RequestBuild(ctx, BuildRequest{Name: "web:default"})
	if err != nil || a.TemplateID != "web" || b.TemplateID != "web" || a.BuildID == b.BuildID || len(a.BuildID) != 36 {
		t.Fatalf("two requests: %+v %+v %v", a, b, err)
	}
	info, err := f.svc.Status(ctx, "web", a.BuildID, 0)
	if err != nil || info.Status != "waiting" || info.LogEntries == nil || info.Logs == nil || info.Reason != nil {
		t.Fatalf("waiting status: %+v %v", info, err)
	}
	if _, err := f.svc.Status(ctx, "other", a.BuildID, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("status under another template: %v", err)
	}
	hash := strings.Repeat("e", 64)
	for _, c := range []struct {
		spec BuildSpec
		want error
		has  string
	}{
		{BuildSpec{FromTemplate: "missing"}, errdefs.ErrInvalidArgument, `"missing", does not exist`},
		{BuildSpec{FromTemplate: "web"}, errdefs.ErrInvalidArgument, "from itself"},
		{BuildSpec{FromImage: "python:3.12"}, errdefs.ErrInvalidArgument, "--from-image python:3.12"},
		{BuildSpec{Steps: []Step{{Type: StepCopy, Args: []string{"a", "/a", "", ""}, FilesHash: hash}}}, errdefs.ErrInvalidArgument, "never uploaded"},
	} {
		if err := f.svc.StartBuild(ctx, "web", a.BuildID, c.spec); !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.has) {
			t.Errorf("%+v: %v; want %v with %q", c.spec, err, c.want, c.has)
		}
	}
	// Rebuilding a template sandboxes run from would replace their lower layer.
	now := time.Now()
	if err := f.st.CreateSandbox(ctx, store.Sandbox{ID: "sbx-web", TemplateID: "web", StartedAt: now, EndAt: now.Add(time.Hour),
		State: store.StatePaused, EnvdVersion: "0.2.0"}); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.StartBuild(ctx, "web", a.BuildID, BuildSpec{}); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sbx-web") {
		t.Fatalf("rebuild in use: %v", err)
	}
	if err := f.st.DeleteSandbox(ctx, "sbx-web"); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.StartBuild(ctx, "web", "no-such-build", BuildSpec{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown build: %v", err)
	}
	// Nothing was started by the refused requests.
	if info, _ := f.svc.Status(ctx, "web", a.BuildID, 0); info.Status != "waiting" {
		t.Fatalf("after refused starts: %+v", info)
	}
	// A build whose sandbox cannot start fails at "base" with the reason.
	f.sb.createErr = fmt.Errorf("no node: %w", errdefs.ErrUnavailable)
	if err := f.svc.StartBuild(ctx, "web", a.BuildID, BuildSpec{}); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.StartBuild(ctx, "web", a.BuildID, BuildSpec{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second start: %v", err)
	}
	final, logs := f.wait(t, "web", a.BuildID)
	if final.Status != "error" || final.Reason == nil || final.Reason.Step != "base" || !strings.Contains(final.Reason.Message, "no node") {
		t.Fatalf("failed build: %+v", final)
	}
	if len(logs) == 0 || logs[len(logs)-1].Level != "error" {
		t.Fatalf("logs %+v", logs)
	}
}

// List, resolve, tags and delete over a real registry.
func TestCatalog(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	if _, err := f.reg.Register(ctx, CachePrefix+"0123456789abcdef01234567", template.Meta{}, func(context.Context, string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	pending, _ := f.svc.RequestBuild(ctx, BuildRequest{Name: "pending", CPUCount: 4, MemoryMB: 2048})
	list, err := f.svc.List(ctx)
	if err != nil || len(list) != 2 || list[0].TemplateID != "base" || list[0].BuildStatus != "ready" || list[0].EnvdVersion == "" ||
		list[1].TemplateID != "pending" || list[1].BuildStatus != "waiting" || list[1].BuildID != pending.BuildID || list[1].CPUCount != 4 {
		t.Fatalf("list %+v, %v", list, err)
	}
	if ti, err := f.svc.Resolve(ctx, "base:default"); err != nil || ti.Name != "base" {
		t.Fatalf("resolve: %+v %v", ti, err)
	}
	for _, name := range []string{"pending", "nope", "Bad/Name"} {
		if _, err := f.svc.Resolve(ctx, name); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("resolve %q: %v", name, err)
		}
	}
	tags, err := f.svc.Tags(ctx, "base")
	if err != nil || len(tags) != 1 || tags[0].Tag != "default" {
		t.Fatalf("tags %+v %v", tags, err)
	}
	// A build in progress blocks the delete; so does a sandbox using it.
	if err := f.svc.Delete(ctx, "pending"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete during a build: %v", err)
	}
	now := time.Now()
	if err := f.st.CreateSandbox(ctx, store.Sandbox{ID: "sbx-a", TemplateID: "base", StartedAt: now, EndAt: now.Add(time.Hour),
		State: store.StateRunning, EnvdVersion: "0.2.0"}); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Delete(ctx, "base"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sbx-a") {
		t.Fatalf("delete in use: %v", err)
	}
	if err := f.st.DeleteSandbox(ctx, "sbx-a"); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Delete(ctx, "base"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.Get(ctx, "base"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("base after delete: %v", err)
	}
	if err := f.svc.Delete(ctx, "base"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}
