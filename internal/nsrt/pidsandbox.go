package nsrt

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/errdefs"
)

// SandboxOfPID returns the name (Spec.ID) of the sandbox whose cgroup,
// under cgroup parent, holds host process pid: what the seccomp log needs
// to attribute a kernel record (which carries a host pid) to a sandbox.
// It reads /proc/<pid>/cgroup, whose paths are relative to the reader's
// cgroup namespace, so only the ".../<parent>/<name>" tail is matched.
// A process that has been reaped, or is no sandbox's, is ErrNotFound.
func SandboxOfPID(pid int, parent string) (string, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", fmt.Errorf("process %d: %w: %w", pid, errdefs.ErrNotFound, err)
	}
	defer f.Close()
	return sandboxOfCgroupFile(bufio.NewScanner(f), parent, pid)
}

func sandboxOfCgroupFile(sc *bufio.Scanner, parent string, pid int) (string, error) {
	if parent == "" {
		parent = cgroup.DefaultParent
	}
	marker := "/" + strings.Trim(parent, "/") + "/"
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		path := parts[2] + "/"
		i := strings.LastIndex(path, marker)
		if i < 0 {
			continue
		}
		name, _, _ := strings.Cut(path[i+len(marker):], "/")
		if name != "" {
			return name, nil
		}
	}
	return "", fmt.Errorf("process %d is in no sandbox cgroup under %s: %w", pid, parent, errdefs.ErrNotFound)
}
