package templatebuild

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/store"
)

func TestStaleCutoff(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	const self, inst = "host:/d#new", "host:/d"
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, tc := range []struct {
		name   string
		b      store.TemplateBuild
		stale  bool
		cutoff time.Time
	}{
		{"own running build", store.TemplateBuild{Status: store.BuildBuilding, Owner: self, UpdatedAt: ago(time.Hour)}, false, time.Time{}},
		{"earlier process of this instance", store.TemplateBuild{Status: store.BuildBuilding, Owner: inst + "#old", UpdatedAt: ago(time.Second)}, true, ago(time.Second).Add(1)},
		{"other replica, fresh", store.TemplateBuild{Status: store.BuildBuilding, Owner: "other:/d#x", UpdatedAt: ago(29 * time.Second)}, false, ago(30 * time.Second)},
		{"other replica, silent", store.TemplateBuild{Status: store.BuildBuilding, Owner: "other:/d#x", UpdatedAt: ago(31 * time.Second)}, true, ago(30 * time.Second)},
		{"instance name is a prefix of another's", store.TemplateBuild{Status: store.BuildBuilding, Owner: inst + "2#x", UpdatedAt: ago(time.Second)}, false, ago(30 * time.Second)},
		{"no owner (before ownership)", store.TemplateBuild{Status: store.BuildBuilding, UpdatedAt: ago(time.Minute)}, true, ago(30 * time.Second)},
		{"waiting an hour", store.TemplateBuild{Status: store.BuildWaiting, UpdatedAt: ago(2 * time.Hour)}, true, ago(time.Hour)},
		{"waiting for its uploads", store.TemplateBuild{Status: store.BuildWaiting, UpdatedAt: ago(10 * time.Minute)}, false, ago(time.Hour)},
		{"finished", store.TemplateBuild{Status: store.BuildReady, Owner: "other#x", UpdatedAt: ago(time.Hour)}, false, time.Time{}},
	} {
		cutoff, stale := staleCutoff(tc.b, self, inst, now, 30*time.Second, time.Hour)
		if stale != tc.stale || (stale && !cutoff.Equal(tc.cutoff)) {
			t.Errorf("%s: stale %v cutoff %v; want %v %v", tc.name, stale, cutoff, tc.stale, tc.cutoff)
		}
	}
}

// fakeClock is a settable clock for a Service.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// replica starts another Service on the fixture's store, as another server
// process of instance would, with its own sandboxes and clock.
// B's sweeps every HeartbeatEvery; the test calls failStale itself when
// the replica sweeps rarely (every = an hour).
func (f *fixture) replica(t *testing.T, instance string, sb *testSandboxes, clock *fakeClock, every time.Duration) *Service {
	t.Helper()
	svc, err := New(context.Background(), Config{Store: f.st, Sandboxes: sb, Templates: RegistryTemplates{f.reg},
		FilesDir: filepath.Join(t.TempDir(), "template-files"), Instance: instance, Clock: clock.now,
		HeartbeatEvery: every, StaleAfter: 30 * time.Second, CollectEvery: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	return svc
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A restart of an instance fails at once the builds its earlier process
// ran (killing their sandboxes), and leaves waiting builds (any replica
// may start them) and builds of other live replicas alone.
func TestRestartFailsOwnInterruptedBuilds(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	clock := &fakeClock{t: time.Now()}
	waiting, _ := f.svc.RequestBuild(ctx, BuildRequest{Name: "web"})
	mine, _ := f.svc.RequestBuild(ctx, BuildRequest{Name: "web"})
	theirs, _ := f.svc.RequestBuild(ctx, BuildRequest{Name: "api"})
	for _, b := range []struct{ id, owner, sandbox string }{{mine.BuildID, "a:/d#old", "sbx-old"}, {theirs.BuildID, "b:/d#live", "sbx-b"}} {
		if err := f.st.StartTemplateBuild(ctx, b.id, b.owner); err != nil {
			t.Fatal(err)
		}
		if err := f.st.SetTemplateBuildSandbox(ctx, b.id, b.sandbox); err != nil {
			t.Fatal(err)
		}
	}
	sb := &testSandboxes{reg: f.reg}
	a := f.replica(t, "a:/d", sb, clock, time.Hour)
	info, err := a.Status(ctx, "web", mine.BuildID, 0)
	if err != nil || info.Status != "error" || info.Reason == nil || !strings.Contains(info.Reason.Message, "interrupted: the server restarted") {
		t.Fatalf("own build after restart: %+v %v", info, err)
	}
	if _, _, killed := sb.snapshot(); !slices.Equal(killed, []string{"sbx-old"}) {
		t.Fatalf("killed %v", killed)
	}
	if b, _ := f.st.GetTemplateBuild(ctx, mine.BuildID); b.SandboxID != "" {
		t.Errorf("sandbox of the failed build still recorded: %q", b.SandboxID)
	}
	for _, id := range []string{waiting.BuildID, theirs.BuildID} {
		if b, _ := f.st.GetTemplateBuild(ctx, id); b.Status.Terminal() {
			t.Errorf("build %s (%s) failed at another instance's restart", id, b.Owner)
		}
	}
}

// Replica A runs a build and heartbeats it; replica B leaves it alone
// while the heartbeats come, fails the build of a replica that stopped
// (killing its sandbox) once StaleAfter passed, and when A's heartbeats
// stop reaching the store (its clock stands still), B fails A's build and
// A, told by its next heartbeat, stops running it.
func TestOwnerLiveness(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	start := time.Now()
	clockA, clockB := &fakeClock{t: start}, &fakeClock{t: start}
	sbA := &testSandboxes{reg: f.reg, envdBlock: make(chan struct{})}
	sbB := &testSandboxes{reg: f.reg}
	a := f.replica(t, "a:/d", sbA, clockA, 10*time.Millisecond) // heartbeats often
	b := f.replica(t, "b:/d", sbB, clockB, time.Hour)           // sweeps when the test says

	// Requested through B, started (and so run) by A.
	req, err := b.RequestBuild(ctx, BuildRequest{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.StartBuild(ctx, req.TemplateID, req.BuildID, BuildSpec{FromTemplate: "base", Steps: []Step{{Type: StepRun, Args: []string{"true"}}}}); err != nil {
		t.Fatal(err)
	}
	row := func(id string) store.TemplateBuild {
		t.Helper()
		r, err := f.st.GetTemplateBuild(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waitFor(t, "the build sandbox", func() bool { return row(req.BuildID).SandboxID == "sbx-1" })
	if got := row(req.BuildID).Owner; got != a.owner {
		t.Fatalf("owner %q; want %q", got, a.owner)
	}

	// Ten minutes later on both clocks: A's heartbeats keep the build.
	clockA.add(10 * time.Minute)
	waitFor(t, "a heartbeat", func() bool { return row(req.BuildID).UpdatedAt.Equal(clockA.now()) })
	clockB.add(10 * time.Minute)
	if err := b.failStale(ctx); err != nil {
		t.Fatal(err)
	}
	if r := row(req.BuildID); r.Status != store.BuildBuilding {
		t.Fatalf("live build failed: %+v", r)
	}

	// A replica that died: its build goes once StaleAfter passed.
	dead, _ := b.RequestBuild(ctx, BuildRequest{Name: "other"})
	if err := f.st.StartTemplateBuild(ctx, dead.BuildID, "c:/d#dead"); err != nil {
		t.Fatal(err)
	}
	if err := f.st.SetTemplateBuildSandbox(ctx, dead.BuildID, "sbx-dead"); err != nil {
		t.Fatal(err)
	}
	// Its last heartbeat: now on the replicas' clocks.
	if ok, err := f.st.HeartbeatTemplateBuild(ctx, dead.BuildID, "c:/d#dead", clockB.now()); !ok || err != nil {
		t.Fatalf("heartbeat of the dead replica's build: %v %v", ok, err)
	}
	if err := b.failStale(ctx); err != nil {
		t.Fatal(err)
	}
	if row(dead.BuildID).Status != store.BuildBuilding {
		t.Fatal("build failed before StaleAfter")
	}

	// A's clock stops; B's runs on past StaleAfter.
	clockB.add(31 * time.Second)
	waitFor(t, "B failing the stale builds", func() bool {
		if err := b.failStale(ctx); err != nil {
			t.Fatal(err)
		}
		return row(dead.BuildID).Status == store.BuildError && row(req.BuildID).Status == store.BuildError
	})
	if _, _, killed := sbB.snapshot(); !slices.Contains(killed, "sbx-dead") || !slices.Contains(killed, "sbx-1") {
		t.Fatalf("B killed %v; want sbx-dead and sbx-1", killed)
	}
	for _, id := range []string{dead.BuildID, req.BuildID} {
		info, err := b.Status(ctx, map[string]string{dead.BuildID: "other", req.BuildID: "app"}[id], id, 0)
		if err != nil || info.Reason == nil || !strings.Contains(info.Reason.Message, "start the build again") {
			t.Fatalf("reason of %s: %+v %v", id, info, err)
		}
	}
	// A learns it lost the build and stops it (its runner kills the
	// sandbox too and logs why).
	waitFor(t, "A stopping the lost build", func() bool {
		_, _, killed := sbA.snapshot()
		return slices.Contains(killed, "sbx-1")
	})
	waitFor(t, "A's log of the lost build", func() bool {
		info, err := a.Status(ctx, "app", req.BuildID, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range info.LogEntries {
			if strings.Contains(e.Message, "heartbeats stopped") {
				return true
			}
		}
		return false
	})
}
