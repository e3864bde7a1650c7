// Package hostns finds the host's namespaces from a process in a container
// of a Pod with hostPID: true (pid 1's when root may open them, else the
// nearest ancestor's: the container runtime's shim), for the cubelet's
// --host-netns=auto, its shims' mount namespace and `cube kube share-mounts`.
package hostns

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Namespace is where a namespace of the host was found.
type Namespace struct {
	Path string // e.g. /proc/1/ns/net or /proc/4242/ns/net
	PID  int
	ID   string // e.g. net:[4026531833]
	// Tried says, for each candidate passed over, why.
	Tried []string
}

// Find finds the host's namespace of kind ("net", "mnt", ...) for the
// process self, which runs in a container of a Pod with hostPID: true and
// its own namespace of that kind (a Pod on the Pod network, a container's
// mount namespace). Candidates, in order: pid 1 (the host's init on systemd
// nodes), then self's ancestors, nearest first (the first is the container
// runtime's shim, a host process). The first whose namespace can be opened
// and differs from self's wins. pid 1 is not always usable: on some hosts
// root may not open its namespaces (a VM whose init is not the node's), and
// without hostPID it is the container's own init.
//
// An error says what was tried and what to change; with hostNetwork (the
// Pod already in the host netns) there is nothing to find, so it fails too.
func Find(procDir string, self int, kind string) (Namespace, error) {
	own, err := ID(procDir, self, kind)
	if err != nil {
		return Namespace{}, fmt.Errorf("host %s namespace: own namespace: %w", kind, err)
	}
	var h Namespace
	candidates := []int{1}
	for pid, seen := self, 0; seen < 64; seen++ {
		ppid, err := Parent(procDir, pid)
		if err != nil || ppid <= 0 {
			break
		}
		if ppid != 1 {
			candidates = append(candidates, ppid)
		}
		pid = ppid
	}
	for _, pid := range candidates {
		if pid == self {
			continue
		}
		p := filepath.Join(procDir, strconv.Itoa(pid), "ns", kind)
		id, err := openNS(p)
		switch {
		case err != nil:
			h.Tried = append(h.Tried, fmt.Sprintf("%s: %v", p, err))
		case id == own:
			h.Tried = append(h.Tried, fmt.Sprintf("%s: same namespace as this process (%s)", p, own))
		default:
			h.Path, h.PID, h.ID = p, pid, id
			return h, nil
		}
	}
	return h, fmt.Errorf("no host %s namespace found from pid %d (tried %s): run in a Pod with hostPID: true on its own %s namespace (with hostNetwork: true the cubelet needs no --host-netns): %w",
		kind, self, strings.Join(h.Tried, "; "), kind, errdefs.ErrFailedPrecondition)
}

// openNS opens a namespace file the way a join would (not just its link)
// and returns its identity.
func openNS(p string) (string, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	link, err := os.Readlink(p)
	if err != nil {
		return "", err
	}
	// The link names the kind and inode; the device makes it unique.
	return fmt.Sprintf("%s@%d", link, st.Dev), nil
}

// ID identifies the namespace of kind of pid (kind:[inode]@device).
func ID(procDir string, pid int, kind string) (string, error) {
	return openNS(filepath.Join(procDir, strconv.Itoa(pid), "ns", kind))
}

// Parent reads the PPid of pid from <procDir>/<pid>/status.
func Parent(procDir string, pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("%s/%d/status: no PPid", procDir, pid)
}
