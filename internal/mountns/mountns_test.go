package mountns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain serves the re-executed child of TestFindHostFromContainer: it
// runs in a mount namespace of its own and prints what FindHost found.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "find-host" {
		os.Exit(findHostMain())
	}
	os.Exit(m.Run())
}

// findHostMain is the child's whole program; it returns its exit code.
func findHostMain() int {
	p, err := FindHost()
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println(p)
	return 0
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount namespaces)")
	}
}

// container starts a process in a mount namespace of its own with a tmpfs
// on dir holding a marker file, which the host does not see.
func container(t testing.TB, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", `mount --make-rprivate / && mount -t tmpfs cube-mountns-test "$1" && touch "$1/marker" && echo ready && exec sleep 60`, "sh", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("container did not start: %q %v", buf, err)
	}
	return cmd
}

func TestDoJoinsNamespace(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	c := container(t, dir)
	nsPath := fmt.Sprintf("/proc/%d/ns/mnt", c.Process.Pid)
	ns, err := Open(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	marker := filepath.Join(dir, "marker")
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the container's tmpfs is visible here; the test proves nothing")
	}
	if err := ns.Do(func() error { _, err := os.Stat(marker); return err }); err != nil {
		t.Fatalf("marker not visible inside the namespace: %v", err)
	}
	// A process started in Do lives in the namespace, with root and cwd there.
	var out []byte
	if err := ns.Do(func() error {
		var err error
		out, err = exec.Command("/bin/sh", "-c", `readlink /proc/self/ns/mnt; ls "$1"`, "sh", dir).Output()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want, _ := os.Readlink(nsPath)
	if got := strings.Fields(string(out)); len(got) != 2 || got[0] != want || got[1] != "marker" {
		t.Fatalf("child in namespace printed %q, want %s and the marker", out, want)
	}
	// This process stayed where it was, on every thread.
	self, _ := Self()
	if self == ns.ID() {
		t.Fatal("the test's own thread moved into the namespace")
	}
	shared := t.TempDir()
	if same, err := ns.Same(dir, shared); err != nil || len(same) != 2 || same[0] || !same[1] {
		t.Fatalf("Same(tmpfs dir, shared dir) = %v, %v; want false, true", same, err)
	}
	if _, err := ns.Same("/nonexistent"); err == nil {
		t.Fatal("Same accepted a path missing here")
	}
}

// TestDoManyTimes checks that the threads Do uses are discarded, not
// reused: after many calls every remaining thread is still here.
func TestDoManyTimes(t *testing.T) {
	needRoot(t)
	c := container(t, t.TempDir())
	ns, err := Open(fmt.Sprintf("/proc/%d/ns/mnt", c.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	for range 200 {
		if err := ns.Do(func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	self, _ := IDOf("/proc/self/ns/mnt")
	tasks, _ := os.ReadDir("/proc/self/task")
	time.Sleep(10 * time.Millisecond)
	for _, task := range tasks {
		id, err := IDOf("/proc/self/task/" + task.Name() + "/ns/mnt")
		if err == nil && id != self {
			t.Errorf("thread %s is still in the other mount namespace", task.Name())
		}
	}
}

func TestOpenRefusesNonMountNS(t *testing.T) {
	needRoot(t)
	if _, err := Open("/proc/self/ns/net"); err == nil {
		t.Fatal("Open accepted a network namespace")
	}
	if _, err := Open("/nonexistent"); err == nil {
		t.Fatal("Open accepted a missing file")
	}
}

func TestFindHostFromContainer(t *testing.T) {
	needRoot(t)
	// On the host, every visible ancestor shares our namespace.
	if p, err := FindHost(); err != nil || p != "" {
		t.Fatalf("FindHost on the host = %q, %v; want none", p, err)
	}
	cmd := exec.Command(os.Args[0], "find-host")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := strings.TrimSpace(string(out))
	// pid 1's where root may open it, else the parent's: either is ours.
	want := fmt.Sprintf("/proc/%d/ns/mnt", os.Getpid())
	gotID, err := IDOf(got)
	if err != nil {
		t.Fatalf("FindHost in a container = %q: %v", got, err)
	}
	if wantID, _ := IDOf(want); gotID != wantID {
		t.Fatalf("FindHost in a container = %q, want the parent's namespace %s", got, want)
	}
}

// BenchmarkStart measures what starting a process in another mount
// namespace adds to a plain start (a shim start per create): the thread,
// unshare and setns of Do.
func BenchmarkStart(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	c := container(b, b.TempDir())
	ns, err := Open(fmt.Sprintf("/proc/%d/ns/mnt", c.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Close()
	run := func() error {
		cmd := exec.Command("/bin/true")
		if err := cmd.Start(); err != nil {
			return err
		}
		return cmd.Wait()
	}
	b.Run("here", func(b *testing.B) {
		for b.Loop() {
			if err := run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("in-namespace", func(b *testing.B) {
		for b.Loop() {
			if err := ns.Do(run); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("do-only", func(b *testing.B) {
		for b.Loop() {
			if err := ns.Do(func() error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
