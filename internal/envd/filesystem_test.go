package envd_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/cube-dev/cube/api/gen/envd/filesystem"
)

func TestListDirDepthStatMoveRemove(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	root := filepath.Join(e.rootDir, "tree")
	for _, d := range []string{"a/b/c", "d"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(root, "f.txt"), "12345")
	writeFile(t, filepath.Join(root, "a/b/c/deep.txt"), "x")
	if err := os.Symlink("f.txt", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}

	names := func(depth uint32) []string {
		t.Helper()
		resp, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "tree", Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, en := range resp.Msg.GetEntries() {
			rel, _ := filepath.Rel(root, en.GetPath())
			out = append(out, rel)
		}
		sort.Strings(out)
		return out
	}
	if got := strings.Join(names(1), ","); got != "a,d,f.txt,link" {
		t.Errorf("depth 1: %s", got)
	}
	if got := strings.Join(names(0), ","); got != "a,d,f.txt,link" {
		t.Errorf("depth 0: %s", got)
	}
	if got := strings.Join(names(3), ","); got != "a,a/b,a/b/c,d,f.txt,link" {
		t.Errorf("depth 3: %s", got)
	}
	if got := strings.Join(names(10), ","); got != "a,a/b,a/b/c,a/b/c/deep.txt,d,f.txt,link" {
		t.Errorf("depth 10: %s", got)
	}

	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(root, "f.txt")}))
	if err != nil {
		t.Fatal(err)
	}
	en := st.Msg.GetEntry()
	if en.GetName() != "f.txt" || en.GetType() != fspb.FileType_FILE_TYPE_FILE || en.GetSize() != 5 ||
		en.GetOwner() != "root" || en.GetGroup() != "root" || en.GetPermissions() != "-rw-r--r--" || en.GetMode() != 0o644 ||
		en.GetModifiedTime().AsTime().IsZero() {
		t.Errorf("stat entry = %v", en)
	}
	st, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "~/tree/link"}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_SYMLINK || st.Msg.GetEntry().GetSymlinkTarget() != filepath.Join(root, "f.txt") {
		t.Errorf("symlink entry = %v", st.Msg.GetEntry())
	}

	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "tree/f.txt", Destination: "tree/new/dir/g.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.GetEntry().GetPath() != filepath.Join(root, "new/dir/g.txt") || mv.Msg.GetEntry().GetSize() != 5 {
		t.Errorf("move entry = %v", mv.Msg.GetEntry())
	}
	_, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "tree/f.txt"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: "tree/missing", Destination: "tree/x"}))
	wantCode(t, err, connect.CodeNotFound)

	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "tree/a"})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a")); !os.IsNotExist(err) {
		t.Errorf("tree/a still exists: %v", err)
	}
	_, err = e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: "tree/a"}))
	wantCode(t, err, connect.CodeNotFound)

	// Bad inputs.
	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "tree/missing"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: "tree/new/dir/g.txt"}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "tree/new/dir/g.txt/below"}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "a\x00b"}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestMakeDir(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	req := connect.NewRequest(&fspb.MakeDirRequest{Path: "p/q/r"})
	req.Header().Set("Authorization", basicUser("tester"))
	resp, err := e.fs.MakeDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	en := resp.Msg.GetEntry()
	if en.GetPath() != filepath.Join(e.userDir, "p/q/r") || en.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || en.GetOwner() != "tester" {
		t.Errorf("entry = %v", en)
	}
	for _, d := range []string{"p", "p/q", "p/q/r"} {
		fi, err := os.Stat(filepath.Join(e.userDir, d))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != testUID || st.Gid != testUID {
			t.Errorf("%s owned by %d:%d, want %d", d, st.Uid, st.Gid, testUID)
		}
	}
	req = connect.NewRequest(&fspb.MakeDirRequest{Path: "p/q"})
	req.Header().Set("Authorization", basicUser("tester"))
	_, err = e.fs.MakeDir(ctx, req)
	wantCode(t, err, connect.CodeAlreadyExists)
	writeFile(t, filepath.Join(e.rootDir, "file"), "x")
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: "file/sub"}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestWatchDir(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	root := filepath.Join(e.rootDir, "watched")
	if err := os.MkdirAll(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: "watched", Recursive: true, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first message = %v (%v), want start", s.Msg(), s.Err())
	}
	seen := map[string]bool{}
	var created *fspb.FilesystemEvent
	await := func(want string) {
		t.Helper()
		for !seen[want] && s.Receive() {
			ev := s.Msg().GetFilesystem()
			if ev == nil {
				continue
			}
			seen[ev.GetName()+" "+ev.GetType().String()] = true
			if ev.GetType() == fspb.EventType_EVENT_TYPE_CREATE && created == nil {
				created = ev
			}
		}
	}
	writeFile(t, filepath.Join(root, "sub", "x.txt"), "hi")
	await("sub/x.txt EVENT_TYPE_WRITE")
	if err := os.Remove(filepath.Join(root, "sub", "x.txt")); err != nil {
		t.Fatal(err)
	}
	await("sub/x.txt EVENT_TYPE_REMOVE")
	// A directory created after the watch started is watched too.
	if err := os.Mkdir(filepath.Join(root, "late"), 0o755); err != nil {
		t.Fatal(err)
	}
	await("late EVENT_TYPE_CREATE")
	writeFile(t, filepath.Join(root, "late", "y"), "")
	await("late/y EVENT_TYPE_CREATE")
	for _, want := range []string{"sub/x.txt EVENT_TYPE_CREATE", "sub/x.txt EVENT_TYPE_WRITE", "sub/x.txt EVENT_TYPE_REMOVE", "late/y EVENT_TYPE_CREATE"} {
		if !seen[want] {
			t.Errorf("missing event %q in %v", want, seen)
		}
	}
	if created.GetEntry().GetName() != "x.txt" {
		t.Errorf("create event entry = %v", created.GetEntry())
	}

	_, err = firstWatchErr(e, ctx, "watched/missing")
	wantCode(t, err, connect.CodeNotFound)
	writeFile(t, filepath.Join(root, "plain"), "")
	_, err = firstWatchErr(e, ctx, "watched/plain")
	wantCode(t, err, connect.CodeInvalidArgument)
}

func firstWatchErr(e *env, ctx context.Context, path string) (bool, error) {
	s, err := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: path}))
	if err != nil {
		return false, err
	}
	defer s.Close()
	got := s.Receive()
	return got, s.Err()
}

func TestPolledWatcher(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := testCtx(t, 20*time.Second)
	root := filepath.Join(e.rootDir, "polled")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: root}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	writeFile(t, filepath.Join(root, "a"), "1")
	var events []*fspb.FilesystemEvent
	deadline := time.Now().Add(5 * time.Second)
	for len(events) == 0 && time.Now().Before(deadline) {
		resp, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, resp.Msg.GetEvents()...)
		time.Sleep(20 * time.Millisecond) // polling is the API under test
	}
	if len(events) == 0 || events[0].GetName() != "a" || events[0].GetType() != fspb.EventType_EVENT_TYPE_CREATE {
		t.Fatalf("events = %v", events)
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: "nope"}))
	wantCode(t, err, connect.CodeNotFound)
}
