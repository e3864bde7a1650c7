package cubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/mountns"
	"github.com/cube-dev/cube/internal/supervisor"
)

// shimOf returns the pid of the shim (supervisor) of the runtime called name.
func shimOf(t *testing.T, c *Cubelet, name string) int {
	t.Helper()
	info, err := supervisor.ReadInfo(c.sandboxDir(name))
	if err != nil {
		t.Fatal(err)
	}
	return info.PID
}

// TestUpgradeRecyclesPoolSlots: a cubelet of another version drops the
// warm-pool slots an earlier one made, pre-started (their supervisors are
// killed) or plain, and makes new ones, while it adopts the user sandbox
// made from an old slot, whatever its version. A restart of the same
// version keeps the slots.
func TestUpgradeRecyclesPoolSlots(t *testing.T) {
	for _, prestart := range []bool{true, false} {
		t.Run(fmt.Sprintf("prestart=%v", prestart), func(t *testing.T) {
			n := newTestNode(t)
			n.cfg.PoolSize, n.cfg.PoolPrestart, n.cfg.Version = 2, prestart, "v1.0.0-old"
			c := n.start(t)
			ctx := context.Background()
			waitPool(t, c, 2)
			if _, err := c.CreateSandbox(ctx, createReq("user")); err != nil {
				t.Fatal(err)
			}
			rec, err := c.store.Get("user")
			if err != nil {
				t.Fatal(err)
			}
			userShim := shimOf(t, c, rec.Runtime())
			waitPool(t, c, 2)
			old := readySlots(c)
			c.Close()

			// Same version: the slots are kept.
			c = n.start(t)
			if got := readySlots(c); len(got) != 2 || !sameSlots(got, old) {
				t.Fatalf("same-version restart replaced slots: %v -> %v", slotIDs(old), slotIDs(got))
			}
			c.Close()

			n.cfg.Version = "v1.0.1-new"
			c = n.start(t)
			if ri := c.runtime.Load(); !strings.HasPrefix(ri.Stamp, "v1.0.1-new+") {
				t.Fatalf("runtime stamp %q", ri.Stamp)
			}
			for _, s := range old {
				if _, err := c.store.Get(s.rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("old slot %s still recorded (%v)", s.rec.ID, err)
				}
				if s.prestarted() {
					waitGone(t, s.shim.pid)
				}
				if _, err := os.Stat(c.slotFilePath(s.rec.ID)); err == nil {
					t.Errorf("old slot %s left its pool file", s.rec.ID)
				}
			}
			// The user sandbox is adopted: same supervisor, still serving.
			if got := shimOf(t, c, rec.Runtime()); got != userShim || procOf(userShim) == (procID{}) {
				t.Fatalf("user sandbox supervisor %d -> %d", userShim, got)
			}
			if err := envdHealthy(t, c, "user"); err != nil {
				t.Fatal(err)
			}
			waitPool(t, c, 2)
			fresh := readySlots(c)
			for _, s := range fresh {
				f, err := c.readSlotFile(s.rec.ID)
				if err != nil || f.Stamp != c.stamp() || s.stamp != c.stamp() {
					t.Errorf("new slot %s stamp %q/%q, want %q (%v)", s.rec.ID, f.Stamp, s.stamp, c.stamp(), err)
				}
				for _, o := range old {
					if o.rec.ID == s.rec.ID {
						t.Errorf("slot %s survived the upgrade", s.rec.ID)
					}
				}
			}
			assertClean(t, c, "user")
			// The new slots serve creates.
			if _, err := c.CreateSandbox(ctx, createReq("after")); err != nil {
				t.Fatal(err)
			}
			if err := envdHealthy(t, c, "after"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func slotIDs(s []poolSlot) []string {
	var ids []string
	for _, x := range s {
		ids = append(ids, x.rec.ID)
	}
	return ids
}

func sameSlots(a, b []poolSlot) bool {
	ids := map[string]bool{}
	for _, s := range a {
		ids[s.rec.ID] = true
	}
	for _, s := range b {
		if !ids[s.rec.ID] {
			return false
		}
	}
	return len(a) == len(b)
}

// TestReplacedBinaryRecyclesPoolSlots: the installer replaces envd while
// the cubelet runs; the next maintenance pass drops the slots made from the
// old binary and the pool makes new ones.
func TestReplacedBinaryRecyclesPoolSlots(t *testing.T) {
	n := newTestNode(t)
	dir := t.TempDir()
	n.cfg.EnvdPath = copyFile(t, envdBinary(t), filepath.Join(dir, "envd"))
	copyFile(t, filepath.Join(filepath.Dir(envdBinary(t)), ReaperName), filepath.Join(dir, ReaperName))
	n.cfg.PoolSize = 1
	c := n.start(t)
	waitPool(t, c, 1)
	old := readySlots(c)[0]
	before := c.stamp()
	c.refreshRuntime()
	if c.stamp() != before || readySlots(c)[0].rec.ID != old.rec.ID {
		t.Fatal("refresh without a change recycled the pool")
	}
	// Replace it the way the installer does: a new file renamed into place.
	tmp := copyFile(t, envdBinary(t), filepath.Join(dir, ".envd.new"))
	if err := os.Rename(tmp, n.cfg.EnvdPath); err != nil {
		t.Fatal(err)
	}
	c.refreshRuntime()
	if c.stamp() == before {
		t.Fatal("stamp unchanged after the binary was replaced")
	}
	waitGone(t, old.shim.pid)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := readySlots(c)
		if len(got) == 1 && got[0].rec.ID != old.rec.ID && got[0].stamp == c.stamp() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool after the binary changed: %v", slotIDs(got))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ri, err := ReadRuntime(n.cfg.StateDir)
	if err != nil || ri.Stamp != c.stamp() {
		t.Fatalf("runtime.json %+v, %v; want stamp %s", ri, err, c.stamp())
	}
}

func copyFile(t *testing.T, src, dst string) string {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// hostNS starts a process in a mount namespace of its own that stands for
// the host while the test process plays the cubelet's container: it is a
// copy of the test's namespace (state dirs and templates are the same
// files), except that a tmpfs hides hidden (the "image" binaries).
func hostNS(t *testing.T, hidden string) string {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `mount -t tmpfs cube-test-image "$1" && echo ready && exec sleep 600`, "sh", hidden)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	// Pdeathsig follows the forking thread, and the threads mountns.Do
	// uses are discarded: fork from a thread locked for the process's life.
	started, done := make(chan error, 1), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(done)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	buf := make([]byte, 6)
	if _, err := io.ReadFull(out, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("host namespace process did not start: %q %v", buf, err)
	}
	return "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/mnt"
}

// shareDir makes dir a shared mount of itself, as the chart's
// Bidirectional volumes are, so mounts made under it (netns pins) show up
// in namespaces copied from this one afterwards. It returns the undo.
func shareDir(t *testing.T, dir string) func() {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		t.Fatal(err)
	}
	return func() { unix.Unmount(dir, unix.MNT_DETACH) }
}

// TestShimsStartInHostMountNS plays the chart's cube-node container with
// roles swapped: the test process is the container, a process in another
// mount namespace the host, where the directory of the test binary (the
// image's cube-shim) is not visible. Shims must start in the host's mount
// namespace from cube-shim next to envd (the installer's host directory),
// so neither they nor their sandboxes hold the container's mounts, and a
// misconfigured node must be refused at start with the reason.
func TestShimsStartInHostMountNS(t *testing.T) {
	n := newTestNode(t)
	arts := t.TempDir()
	n.cfg.EnvdPath = copyFile(t, envdBinary(t), filepath.Join(arts, "envd"))
	reaper := copyFile(t, filepath.Join(filepath.Dir(envdBinary(t)), ReaperName), filepath.Join(arts, ReaperName))
	unshare := shareDir(t, n.cfg.Network.RunDir)
	// Runs after the cubelet's Close and the host stand-in's end (both
	// registered later), before newTestNode's own cleanup.
	t.Cleanup(func() {
		n.cfg.HostMountNS = HostMountNSOff
		n.destroy(t)
		unshare()
	})
	host := hostNS(t, filepath.Dir(os.Args[0]))
	hostID, err := mountns.IDOf(host)
	if err != nil {
		t.Fatal(err)
	}
	n.cfg.HostMountNS = host
	ctx := context.Background()

	// Refused: without cube-shim next to envd, the image's binary is all
	// there is, and the host cannot run it.
	if _, err := New(ctx, n.cfg, n.templates); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), ShimName) {
		t.Fatalf("New without a host cube-shim: %v", err)
	}
	// The test binary serves shim, sandbox-init and supervise (TestMain).
	shimBin := copyFile(t, os.Args[0], filepath.Join(arts, ShimName))
	// Refused: netns pins made here do not reach the host (a node whose
	// run dir is not shared with it).
	n2 := newTestNode(t)
	n2.cfg.EnvdPath, n2.cfg.HostMountNS = n.cfg.EnvdPath, host
	_, err = New(ctx, n2.cfg, n2.templates)
	n2.cfg.HostMountNS = HostMountNSOff
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), n2.cfg.Network.DataplanePin()) {
		t.Fatalf("New with a private run dir: %v", err)
	}

	n.cfg.PoolSize = 1
	c := n.start(t)
	if _, err := c.CreateSandbox(ctx, createReq("sbx")); err != nil {
		t.Fatal(err)
	}
	if err := envdHealthy(t, c, "sbx"); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, 1)
	shimID, _ := mountns.IDOf(shimBin)
	reaperID, _ := mountns.IDOf(reaper)
	rec, _ := c.store.Get("sbx")
	for _, name := range []string{rec.Runtime(), readySlots(c)[0].rec.ID} {
		info, err := supervisor.ReadInfo(c.sandboxDir(name))
		if err != nil {
			t.Fatal(err)
		}
		proc := "/proc/" + strconv.Itoa(info.PID)
		if id, _ := mountns.IDOf(proc + "/ns/mnt"); id != hostID {
			t.Errorf("%s: supervisor %d is not in the host mount namespace", name, info.PID)
		}
		// No cube-supervisor next to cube-shim: it runs `cube-shim supervise`.
		if id, _ := mountns.IDOf(proc + "/exe"); id != shimID {
			exe, _ := os.Readlink(proc + "/exe")
			t.Errorf("%s: supervisor runs %s, want %s", name, exe, shimBin)
		}
		if exe, _ := os.Readlink(proc + "/exe"); exe != shimBin {
			t.Errorf("%s: supervisor's exe is %q there, want the host path %s", name, exe, shimBin)
		}
		if cwd, _ := os.Readlink(proc + "/cwd"); cwd != "/" {
			t.Errorf("%s: supervisor's cwd is %q, want the host's /", name, cwd)
		}
		if root, _ := mountns.IDOf(proc + "/root"); root != mustID(t, strings.TrimSuffix(host, "/ns/mnt")+"/root") {
			t.Errorf("%s: supervisor's root is not the host's", name)
		}
		// With a user namespace pid 1 execs the reaper just after it
		// releases envd: the create may return a moment before.
		initExe := "/proc/" + strconv.Itoa(info.InitPID) + "/exe"
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if id, _ := mountns.IDOf(initExe); id == reaperID {
				break
			}
		}
		if id, _ := mountns.IDOf(initExe); id != reaperID {
			t.Errorf("%s: sandbox init does not run the host's %s", name, reaper)
		}
	}
	ri, err := ReadRuntime(n.cfg.StateDir)
	if err != nil || ri.Shim != shimBin || ri.MountNS != host || ri.MountNSID != hostID {
		t.Fatalf("runtime.json %+v, %v", ri, err)
	}
	// doctor's view: every supervisor current.
	in, err := Inspect(ctx, n.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Supervisors) != 2 {
		t.Fatalf("supervisors %+v, want the sandbox's and the slot's", in.Supervisors)
	}
	for _, s := range in.Supervisors {
		if !s.Current || s.Version != supervisor.Version {
			t.Errorf("supervisor %+v: want current, version %s", s, supervisor.Version)
		}
	}
	if err := c.KillSandbox(ctx, "sbx"); err != nil {
		t.Fatal(err)
	}
	assertClean(t, c)
}

func mustID(t *testing.T, path string) mountns.ID {
	t.Helper()
	id, err := mountns.IDOf(path)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
