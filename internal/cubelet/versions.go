package cubelet

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/cube-dev/cube/internal/mountns"
	"github.com/cube-dev/cube/internal/nodestore"
	"github.com/cube-dev/cube/internal/supervisor"
)

// SupervisorStatus is one live supervisor (a sandbox's or a pre-started
// pool slot's) as `cube node doctor` shows it.
type SupervisorStatus struct {
	Owner string `json:"owner"` // sandbox or pool slot id
	PID   int    `json:"pid"`
	// Version is what the supervisor recorded in shim.json (the Cube version
	// of the binary it runs).
	Version string `json:"version"`
	// Exe is its binary as the kernel names it (/proc/<pid>/exe, in the
	// supervisor's own mount namespace; " (deleted)" once replaced).
	Exe string `json:"exe"`
	// MountNS is its mount namespace (/proc/<pid>/ns/mnt).
	MountNS string `json:"mountNS"`
	// Current is true when it runs the supervisor binary, in the mount
	// namespace, that the node starts sandboxes with now (RuntimeFile);
	// false for one started by an earlier runtime (another version, a
	// replaced binary, or a container's mount namespace, whose root file
	// system it keeps mounted until its sandbox ends).
	Current bool `json:"current"`
}

// inspectSupervisors lists the supervisors of the live records, compared
// with the runtime the node records in its state dir (if any).
func inspectSupervisors(cfg Config, in *Inspection, recs map[string]nodestore.Sandbox, live, liveRT map[string]bool) {
	if ri, err := ReadRuntime(cfg.StateDir); err == nil {
		in.Runtime = &ri
	}
	in.Supervisors = []SupervisorStatus{}
	for id, r := range recs {
		if !live[id] || !liveRT[r.Runtime()] {
			continue
		}
		info, err := supervisor.ReadInfo(filepath.Join(cfg.sandboxesDir(), r.Runtime()))
		if err != nil || procOf(info.PID) == (procID{}) {
			continue // a plain pool slot, or its supervisor just exited
		}
		in.Supervisors = append(in.Supervisors, supervisorStatus(id, info, in.Runtime))
	}
	sort.Slice(in.Supervisors, func(i, j int) bool { return in.Supervisors[i].Owner < in.Supervisors[j].Owner })
}

// supervisorStatus reads what the kernel says of info's supervisor process.
func supervisorStatus(owner string, info supervisor.Info, ri *RuntimeInfo) SupervisorStatus {
	proc := "/proc/" + strconv.Itoa(info.PID)
	s := SupervisorStatus{Owner: owner, PID: info.PID, Version: info.Version}
	s.Exe, _ = os.Readlink(proc + "/exe")
	s.MountNS, _ = os.Readlink(proc + "/ns/mnt")
	if ri != nil {
		exe, err1 := mountns.IDOf(proc + "/exe")
		ns, err2 := mountns.IDOf(proc + "/ns/mnt")
		s.Current = err1 == nil && err2 == nil && exe == ri.SupervisorFile && ns == ri.MountNSID
	}
	return s
}

// SupervisorVersions counts supervisors per version.
func SupervisorVersions(sups []SupervisorStatus) map[string]int {
	n := map[string]int{}
	for _, s := range sups {
		n[s.Version]++
	}
	return n
}
