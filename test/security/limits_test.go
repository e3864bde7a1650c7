package security

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nsrt"
)

// TestForkBombContained runs a shell fork bomb in one sandbox and checks the
// pids limit holds, the host can still fork and a second sandbox answers.
func TestForkBombContained(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ping := w.neighbour(ctx)
	const pidsMax = 64
	sb := w.start(ctx, "echo x >&3; bomb() { bomb | bomb & }; bomb; exec sleep 1000",
		cgroup.Resources{CPUCount: 1, MemoryMB: 128, PidsMax: pidsMax}, 0)
	cg := w.cgroupOf(sb)
	var st cgroup.Stats
	if !eventually(10*time.Second, func() bool {
		st, _ = cg.Stats()
		return st.PidsLimitHits > 0
	}) {
		t.Fatalf("the fork bomb never hit pids.max: %+v", st)
	}
	for range 5 {
		if st, err := cg.Stats(); err != nil || st.Pids > pidsMax {
			t.Errorf("stats %+v, %v: more than %d tasks", st, err, pidsMax)
		}
		if err := ping(); err != nil {
			t.Errorf("neighbour during the fork bomb: %v", err)
		}
		hostResponsive(t)
	}
	// Killing a fork-bombed sandbox works (the cgroup is frozen first).
	kctx, kcancel := context.WithTimeout(ctx, 20*time.Second)
	defer kcancel()
	if err := sb.Kill(kctx); err != nil {
		t.Fatalf("kill the bombed sandbox: %v", err)
	}
	if err := ping(); err != nil {
		t.Errorf("neighbour after the fork bomb: %v", err)
	}
}

// TestMemoryHogOOMKilledInside allocates far past the memory limit: the
// kernel kills the hog inside the sandbox only, the counters show it, the
// sandbox's init and a second sandbox live on.
func TestMemoryHogOOMKilledInside(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ping := w.neighbour(ctx)
	sb := w.start(ctx, "/bin/probe hog 512 > /shared/hog.out 2>&1; echo $? > /shared/hog.rc; echo x >&3; exec sleep 1000",
		cgroup.Resources{CPUCount: 1, MemoryMB: 48, PidsMax: 32}, 0)
	if rc := strings.TrimSpace(w.readShared("hog.rc")); rc != "137" {
		t.Errorf("hog exit status %s (output %q), want 137 (SIGKILL)", rc, w.readShared("hog.out"))
	}
	st, err := w.cgroupOf(sb).Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.OOMKills < 1 {
		t.Errorf("stats %+v: want OOMKills > 0", st)
	}
	if s, err := sb.State(ctx); err != nil || !s.Running {
		t.Errorf("sandbox state after the OOM kill: %+v, %v; want running", s, err)
	}
	if err := ping(); err != nil {
		t.Errorf("neighbour: %v", err)
	}
	hostResponsive(t)
}

// TestDiskFillerGetsENOSPC fills a sandbox with a 32 MB disk: the writer
// gets ENOSPC, the host keeps its space, the sandbox and a neighbour live
// on, and the loop device is gone after cleanup.
func TestDiskFillerGetsENOSPC(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ping := w.neighbour(ctx)
	const diskMB = 32
	sb := w.start(ctx, "/bin/probe fill /tmp/fill > /shared/fill.out 2>&1; echo x >&3; exec sleep 1000",
		cgroup.Resources{CPUCount: 1, MemoryMB: 128, PidsMax: 32}, diskMB)
	got := results(w.readShared("fill.out"))
	if got["fill"] != "ENOSPC" {
		t.Errorf("filler ended with %q, want ENOSPC", got["fill"])
	}
	if n, _ := strconv.ParseInt(got["written"], 10, 64); n < diskMB<<20/2 || n > diskMB<<20 {
		t.Errorf("filler wrote %d bytes into a %d MB disk", n, diskMB)
	}
	used, size, err := nsrt.DiskUsage(sb.InitPID())
	if err != nil {
		t.Fatal(err)
	}
	if size > diskMB<<20 || used < size/2 {
		t.Errorf("DiskUsage = %d used of %d, want a full disk of at most %d MB", used, size, diskMB)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(sb.stateDir, "disk.img"), &st); err != nil {
		t.Fatal(err)
	}
	if onHost := st.Blocks * 512; onHost > diskMB<<20+1<<20 {
		t.Errorf("disk image takes %d bytes on the host, more than its %d MB", onHost, diskMB)
	}
	if s, err := sb.State(ctx); err != nil || !s.Running {
		t.Errorf("sandbox state after filling its disk: %+v, %v; want running", s, err)
	}
	if err := ping(); err != nil {
		t.Errorf("neighbour: %v", err)
	}
	// The loop device detaches by itself once the sandbox is gone.
	kctx, kcancel := context.WithTimeout(ctx, 20*time.Second)
	defer kcancel()
	if err := sb.Kill(kctx); err != nil {
		t.Fatal(err)
	}
	if !eventually(5*time.Second, func() bool { return loopBackedBy(sb.stateDir) == "" }) {
		t.Errorf("loop device %s still backed by the sandbox's image after kill", loopBackedBy(sb.stateDir))
	}
}

// loopBackedBy returns a loop device whose backing file is under dir.
func loopBackedBy(dir string) string {
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir) {
			return f
		}
	}
	return ""
}
