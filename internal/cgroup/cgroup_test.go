package cgroup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup/control"
	"github.com/cube-dev/cube/internal/errdefs"
)

func randName(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

func hostLayout(t *testing.T) Layout {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	l, err := DetectLayout()
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	return l
}

// proc is a started process whose exit can be awaited from several places.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start starts argv; the process is killed and reaped in cleanup whatever
// happens. extra become fds 3... of the child.
func start(t *testing.T, extra []*os.File, argv ...string) *proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = extra
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (p *proc) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("process did not exit")
	}
}

func TestHostCgroupLifecycle(t *testing.T) {
	l := hostLayout(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	parent := randName(t, "cube-test-")
	t.Cleanup(func() {
		for _, d := range uniqueDirs(l.dirs(parent)) {
			_ = os.Remove(d)
		}
	})
	cg, err := OpenLayout(l, parent, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cg.Procs(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Procs before create: %v, want ErrNotFound", err)
	}
	if err := cg.Kill(ctx); err != nil {
		t.Fatalf("Kill of missing cgroup: %v", err)
	}
	t.Cleanup(func() { _ = cg.Kill(context.Background()); _ = cg.Remove(context.Background()) })
	if err := cg.Create(Resources{CPUCount: 1, MemoryMB: 64, PidsMax: 20}); err != nil {
		t.Fatal(err)
	}
	if err := cg.Create(Resources{CPUCount: 1, MemoryMB: 64, PidsMax: 20}); err != nil {
		t.Fatalf("Create is not idempotent: %v", err)
	}
	// The process waits on a pipe so that it is in the cgroup before it runs.
	gateR, gateW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer gateW.Close()
	p := start(t, []*os.File{gateR}, "/bin/busybox", "sh", "-c", "read x <&3; exec /bin/busybox sleep 1000")
	gateR.Close()
	cmd := p.cmd
	if err := cg.AddProc(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	procs, err := cg.Procs()
	if err != nil || !slices.Equal(procs, []int{cmd.Process.Pid}) {
		t.Fatalf("Procs = %v, %v; want [%d]", procs, err, cmd.Process.Pid)
	}
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.MemLimit != 64<<20 || st.Pids != 1 {
		t.Fatalf("Stats = %+v, want MemLimit 64MiB and 1 pid", st)
	}
	if l.Version == V1 {
		b, _ := os.ReadFile(filepath.Join(cg.Dir("cpu"), "cpu.cfs_quota_us"))
		if strings.TrimSpace(string(b)) != "100000" {
			t.Errorf("cfs_quota_us = %q", b)
		}
	}
	ids, err := ListLayout(l, parent)
	if err != nil || !slices.Equal(ids, []string{"sb1"}) {
		t.Fatalf("List = %v, %v", ids, err)
	}

	if err := cg.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cg.Thaw(ctx); err != nil {
		t.Fatal(err)
	}

	if err := cg.Remove(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Remove of a populated cgroup: %v, want ErrFailedPrecondition", err)
	}
	if err := cg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	p.waitExit(t)
	if procs, err := cg.Procs(); err != nil || len(procs) != 0 {
		t.Fatalf("after Kill: %v, %v", procs, err)
	}
	if err := cg.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cg.Remove(ctx); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	if ids, _ := ListLayout(l, parent); len(ids) != 0 {
		t.Fatalf("List after Remove = %v", ids)
	}
	if _, err := cg.Stats(); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stats after Remove: %v", err)
	}
}

func TestKillForkingProcesses(t *testing.T) {
	l := hostLayout(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	parent := randName(t, "cube-test-")
	cg, _ := OpenLayout(l, parent, "bomb")
	t.Cleanup(func() {
		_ = cg.Kill(context.Background())
		_ = cg.Remove(context.Background())
		for _, d := range uniqueDirs(l.dirs(parent)) {
			_ = os.Remove(d)
		}
	})
	if err := cg.Create(Resources{PidsMax: 30}); err != nil {
		t.Fatal(err)
	}
	// A shell that keeps spawning background sleepers once released; it is
	// in the cgroup before it forks anything. pids.max caps it.
	gateR, gateW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer gateW.Close()
	p := start(t, []*os.File{gateR}, "/bin/busybox", "sh", "-c", "read x <&3; while :; do /bin/busybox sleep 1000 & done")
	gateR.Close()
	if err := cg.AddProc(p.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if _, err := gateW.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	// pids.events counts refused forks: the bomb hit the limit.
	if err := control.PollUntil(ctx, func() (bool, error) {
		kv, err := readKeyValues(filepath.Join(cg.Dir("pids"), "pids.events"))
		return err == nil && kv["max"] > 0, err
	}); err != nil {
		t.Fatalf("fork bomb never hit pids.max: %v", err)
	}
	if st, err := cg.Stats(); err != nil || st.Pids > 30 {
		t.Fatalf("Stats = %+v, %v; want at most 30 pids", st, err)
	}
	if err := cg.Kill(ctx); err != nil {
		procs, _ := cg.Procs()
		for _, p := range procs {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
			t.Logf("left: %s", b)
		}
		t.Fatal(err)
	}
	if procs, err := cg.Procs(); err != nil || len(procs) != 0 {
		t.Fatalf("after Kill: %v, %v", procs, err)
	}
}

func TestMoveAll(t *testing.T) {
	l := hostLayout(t)
	name := randName(t, "cube-test-shims-")
	p := start(t, nil, "/bin/busybox", "sleep", "1000")
	cmd := p.cmd
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		p.waitExit(t)
		if err := DeleteEverywhere(context.Background(), name); err != nil {
			t.Errorf("DeleteEverywhere: %v", err)
		}
		for _, d := range l.allHierarchyDirs(name) {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("%s left behind", d)
			}
		}
	})
	if err := MoveAll(name, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if !strings.HasSuffix(line, ":/"+name) {
			t.Errorf("hierarchy not moved: %s", line)
		}
	}
	if err := MoveAll("../x", 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad name: %v", err)
	}
}

// TestFakeV2 drives the v2 code paths against a directory tree that mimics
// cgroupfs (this host's resource controllers are v1).
func TestFakeV2(t *testing.T) {
	root := t.TempDir()
	l := Layout{Version: V2, Unified: root, V1: map[string]string{}}
	sb := filepath.Join(root, "cube", "sb")
	if err := os.MkdirAll(sb, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"cgroup.subtree_control": "", "cube/cgroup.subtree_control": "",
		"cube/sb/memory.max": "max\n", "cube/sb/memory.swap.max": "max\n", "cube/sb/pids.max": "max\n",
		"cube/sb/cpu.max": "max 100000\n", "cube/sb/cgroup.procs": "", "cube/sb/cgroup.kill": "",
		"cube/sb/memory.current": "1234\n", "cube/sb/memory.stat": "anon 1000\nfile 234\n",
		"cube/sb/cpu.stat": "usage_usec 7\nuser_usec 5\n", "cube/sb/pids.current": "3\n",
		"cube/sb/cgroup.freeze": "0\n", "cube/sb/cgroup.events": "populated 0\nfrozen 1\n",
		"cube/sb/memory.events": "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n", "cube/sb/pids.events": "max 2\n",
	}
	for f, c := range files {
		if err := os.WriteFile(filepath.Join(root, f), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cg, err := OpenLayout(l, "cube", "sb")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Create(Resources{CPUCount: 2, MemoryMB: 1, PidsMax: 9}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"cube/sb/memory.max": "1048576", "cube/sb/memory.swap.max": "0", "cube/sb/pids.max": "9",
		"cube/sb/cpu.max": "200000 100000", "cube/cgroup.subtree_control": "+pids",
	}
	for f, w := range want {
		if b, _ := os.ReadFile(filepath.Join(root, f)); string(b) != w {
			t.Errorf("%s = %q, want %q", f, b, w)
		}
	}
	if err := cg.AddProc(42); err != nil {
		t.Fatal(err)
	}
	if p, err := cg.Procs(); err != nil || !slices.Equal(p, []int{42}) {
		t.Errorf("Procs = %v, %v", p, err)
	}
	os.WriteFile(filepath.Join(sb, "memory.max"), []byte("1048576\n"), 0o644)
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st != (Stats{CPUUsageNs: 7000, MemUsage: 1234, MemCache: 234, MemLimit: 1048576, Pids: 3,
		MemLimitHits: 5, OOMKills: 1, PidsLimitHits: 2}) {
		t.Errorf("Stats = %+v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cg.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(sb, "cgroup.freeze")); string(b) != "1" {
		t.Errorf("cgroup.freeze = %q", b)
	}
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if err := cg.Thaw(short); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Thaw that never completes: %v, want ErrUnavailable", err)
	}
	os.WriteFile(filepath.Join(sb, "cgroup.procs"), nil, 0o644)
	if err := cg.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(sb, "cgroup.kill")); string(b) != "1" {
		t.Errorf("cgroup.kill = %q", b)
	}
	if ids, err := ListLayout(l, "cube"); err != nil || !slices.Equal(ids, []string{"sb"}) {
		t.Errorf("List = %v, %v", ids, err)
	}
	// The device allowlist on this fake: TestDevicesV2FailsClosed (root).
}
