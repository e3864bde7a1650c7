package preflight

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// startIn starts argv (under unshare) and returns the pid it prints with
// `echo $$` or `echo $!` as its first line; the process is killed at the
// end of the test.
func startIn(t *testing.T, argv ...string) int {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("%v printed %q", argv, line)
	}
	return pid
}

func ownNS(t *testing.T, kind string) string {
	t.Helper()
	id, err := nsID("/proc", os.Getpid(), kind)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestFindHostNetNS runs a process in a throwaway netns, as the cubelet of
// a Pod on the Pod network with hostPID runs, and checks that the host
// netns found for it is this test's (the host's): through its parent when
// it is a direct child of a host process, through its grandparent when its
// parent shares its netns (a shell in the Pod), and through pid 1 where
// root may open pid 1's namespaces (else pid 1 is reported as tried).
func TestFindHostNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (unshare)")
	}
	host := ownNS(t, "net")
	cases := map[string][]string{
		"child of a host process":          {"unshare", "--net", "sh", "-c", "echo $$; exec sleep 300"},
		"behind a shell in the same netns": {"unshare", "--net", "sh", "-c", "sleep 300 & echo $!; wait"},
	}
	for name, argv := range cases {
		t.Run(name, func(t *testing.T) {
			pid := startIn(t, argv...)
			if id, _ := nsID("/proc", pid, "net"); id == host {
				t.Fatalf("pid %d is in the host netns; the test needs it elsewhere", pid)
			}
			h, err := FindHostNS("/proc", pid, "net")
			if err != nil {
				t.Fatal(err)
			}
			if h.ID != host {
				t.Errorf("found %s (%s), want the host netns %s", h.Path, h.ID, host)
			}
			if got, err := openNS(h.Path); err != nil || got != host {
				t.Errorf("%s opens as %s (%v), want %s", h.Path, got, err, host)
			}
			if h.PID != 1 && (len(h.Tried) == 0 || !strings.HasPrefix(h.Tried[0], "/proc/1/ns/net")) {
				t.Errorf("found via pid %d without having tried pid 1 first: %q", h.PID, h.Tried)
			}
		})
	}
}

// TestFindHostNetNSFailsInTheHostNetns: a process already in the host
// netns (hostNetwork) has no other host netns to find, and the error says
// so instead of returning its own.
func TestFindHostNetNSFailsInTheHostNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (other processes' namespaces)")
	}
	_, err := FindHostNS("/proc", os.Getpid(), "net")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("error %v, want FailedPrecondition", err)
	}
	for _, want := range []string{"hostPID: true", "hostNetwork: true", "/proc/1/ns/net"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := FindHostNS("/proc", 1<<30, "net"); err == nil {
		t.Error("a pid that does not exist: no error")
	}
}

// TestFindHostMountNS: the same resolution for a process in a throwaway
// mount namespace finds this test's mount namespace.
func TestFindHostMountNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (unshare)")
	}
	pid := startIn(t, "unshare", "--mount", "--propagation", "private", "sh", "-c", "echo $$; exec sleep 300")
	h, err := FindHostNS("/proc", pid, "mnt")
	if err != nil {
		t.Fatal(err)
	}
	if h.ID != ownNS(t, "mnt") {
		t.Errorf("found %s (%s), want %s", h.Path, h.ID, ownNS(t, "mnt"))
	}
}

// TestProbeHostNetNS: seen from this test (in the host netns), the host
// netns is reachable through pid 1 or, where root may not open pid 1's
// namespaces (this VM), through an ancestor; run from a throwaway netns
// the probe says it is not in the host's.
func TestProbeHostNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (other processes' namespaces)")
	}
	p := ProbeHostNetNS("/proc")
	if p.Via == "" {
		t.Fatalf("probe from the host netns: %+v", p)
	}
	if _, err := nsID("/proc", 1, "net"); err != nil && !strings.Contains(p.Via, "an ancestor") {
		t.Errorf("pid 1 does not open here (%v), yet the probe says %q", err, p.Via)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--net", exe)
	cmd.Env = append(os.Environ(), "CUBE_TEST_PROBE_HOSTNETNS=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var other HostNetNSProbe
	if err := json.Unmarshal(out, &other); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if other.Via != "" || other.Err == "" {
		t.Errorf("probe from a throwaway netns: %+v, want no way found and a reason", other)
	}
}
