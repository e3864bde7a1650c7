package preflight

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/hostns"
)

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
	if _, err := hostns.ID("/proc", 1, "net"); err != nil && !strings.Contains(p.Via, "an ancestor") {
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
