package hostns

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/proctest"
)

func ownNS(t *testing.T, kind string) string {
	t.Helper()
	id, err := ID("/proc", os.Getpid(), kind)
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
			pid := proctest.StartPrintingPID(t, argv...)
			if id, _ := ID("/proc", pid, "net"); id == host {
				t.Fatalf("pid %d is in the host netns; the test needs it elsewhere", pid)
			}
			h, err := Find("/proc", pid, "net")
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
	_, err := Find("/proc", os.Getpid(), "net")
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("error %v, want FailedPrecondition", err)
	}
	for _, want := range []string{"hostPID: true", "hostNetwork: true", "/proc/1/ns/net"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := Find("/proc", 1<<30, "net"); err == nil {
		t.Error("a pid that does not exist: no error")
	}
}

// TestFindHostMountNS: the same resolution for a process in a throwaway
// mount namespace finds this test's mount namespace.
func TestFindHostMountNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (unshare)")
	}
	pid := proctest.StartPrintingPID(t, "unshare", "--mount", "--propagation", "private", "sh", "-c", "echo $$; exec sleep 300")
	h, err := Find("/proc", pid, "mnt")
	if err != nil {
		t.Fatal(err)
	}
	if h.ID != ownNS(t, "mnt") {
		t.Errorf("found %s (%s), want %s", h.Path, h.ID, ownNS(t, "mnt"))
	}
}
