package cubelet

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A pre-started slot may wait in the pool for a long time; before a create
// takes it, these checks tell whether its sandbox and shim still run,
// without a round trip to the shim.

// procID identifies a process: pid and start time (which tells it from a
// later process with the same pid).
type procID struct {
	pid   int
	start string
}

// procOf returns the identity of pid, or a zero procID.
func procOf(pid int) procID {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if pid <= 0 || err != nil {
		return procID{}
	}
	// Fields after the command (which may hold spaces) start after ')':
	// the state (field 3) first, the start time (field 22) 20th. A zombie
	// is dead.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return procID{}
	}
	return procID{pid: pid, start: f[19]}
}

// nsID identifies a namespace (device and inode of its nsfs file).
type nsID struct{ dev, ino uint64 }

// netnsOf returns the network namespace of pid, or a zero nsID.
func netnsOf(pid int) nsID {
	var st unix.Stat_t
	if pid <= 0 || unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/net", &st) != nil {
		return nsID{}
	}
	return nsID{dev: st.Dev, ino: st.Ino}
}

// alive reports whether a pre-started slot's init and shim still run.
func (s poolSlot) alive() bool {
	return s.initNS != (nsID{}) && netnsOf(s.initPID) == s.initNS &&
		s.shim != (procID{}) && procOf(s.shim.pid) == s.shim
}
