package preflight

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/hostns"
)

// ProbeHostNetNS looks, from a process in the host netns (the bootstrap
// Pod, or the host itself), at what --host-netns=auto would use in a Pod on
// the Pod network: pid 1's netns when root may open it, else an ancestor's
// (in a Pod, the runtime shim). Either must be this process's own netns.
func ProbeHostNetNS(procDir string) HostNetNSProbe {
	own, err := hostns.ID(procDir, os.Getpid(), "net")
	if err != nil {
		return HostNetNSProbe{Err: fmt.Sprintf("own netns: %v", err)}
	}
	p1, err1 := hostns.ID(procDir, 1, "net")
	switch {
	case err1 == nil && p1 == own:
		return HostNetNSProbe{Via: "pid 1"}
	case err1 == nil:
		return HostNetNSProbe{Err: "pid 1 is in another network namespace: run the preflight in the host netns (hostNetwork: true)"}
	}
	for pid, n := os.Getpid(), 0; n < 64; n++ {
		ppid, err := hostns.Parent(procDir, pid)
		if err != nil || ppid <= 1 {
			break
		}
		if id, err := hostns.ID(procDir, ppid, "net"); err == nil && id == own {
			comm, _ := os.ReadFile(filepath.Join(procDir, strconv.Itoa(ppid), "comm"))
			return HostNetNSProbe{Via: fmt.Sprintf("pid %d (%s), an ancestor; pid 1's cannot be opened (%v)", ppid, strings.TrimSpace(string(comm)), err1)}
		}
		pid = ppid
	}
	return HostNetNSProbe{Err: fmt.Sprintf("pid 1's cannot be opened (%v) and no ancestor's is the host's", err1)}
}
