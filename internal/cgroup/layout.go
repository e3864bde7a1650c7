package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/mountinfo"
)

// Version is the cgroup version whose resource controllers Cube uses.
type Version int

const (
	// V1 means the resource controllers are mounted as separate v1 hierarchies.
	V1 Version = 1
	// V2 means the resource controllers live in the unified (cgroup2) hierarchy.
	V2 Version = 2
)

// String returns "v1" or "v2".
func (v Version) String() string { return "v" + strconv.Itoa(int(v)) }

// sandboxControllers are the v1 controllers a sandbox cgroup is created in.
var sandboxControllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer", "devices"}

// requiredControllers must be present for a host to be usable.
var requiredControllers = []string{"memory", "pids", "cpu"}

// Layout says where the cgroup hierarchies are mounted on a host.
type Layout struct {
	Version Version `json:"version"`
	// V1 maps a v1 controller ("memory", "cpu", ..., or "name=systemd" for a
	// named hierarchy) to the mount point of its hierarchy.
	V1 map[string]string `json:"v1,omitempty"`
	// Unified is the mount point of the cgroup2 hierarchy, "" if there is none.
	Unified string `json:"unified,omitempty"`
}

// DetectLayout reads /proc/self/mountinfo and decides the layout. A host whose
// v1 hierarchies carry the memory controller is V1 even if a cgroup2
// hierarchy is mounted too (systemd's hybrid mode); otherwise a cgroup2 mount
// makes it V2.
//
// The file is read once per process: its text grows with every mount of
// the namespace (a netns pin per sandbox), so reading it on each create
// cost a node with 2000 sandboxes more CPU than the rest of the create's
// own work. Hierarchies are mounted at boot; a process outliving a change
// of them (not something hosts do) keeps the layout it started with.
func DetectLayout() (Layout, error) {
	l, err := detectedLayout()
	l.V1 = maps.Clone(l.V1) // callers own their copy
	return l, err
}

var detectedLayout = sync.OnceValues(func() (Layout, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Layout{}, fmt.Errorf("detect cgroup layout: %w", err)
	}
	defer f.Close()
	return ParseMountinfo(f)
})

// ParseMountinfo decides the layout from the text of a mountinfo file.
func ParseMountinfo(r io.Reader) (Layout, error) {
	l := Layout{V1: map[string]string{}}
	sc := bufio.NewScanner(r)
	// Small to start: the shim of every sandbox parses mountinfo, which
	// grows with the node's mounts; lines are short, and only cgroup lines
	// become strings.
	sc.Buffer(make([]byte, 0, 4096), 1024*1024)
	for sc.Scan() {
		if !isCgroupLine(sc.Bytes()) {
			continue
		}
		mountPoint, fsType, superOpts, ok := splitMountinfoLine(sc.Text())
		if !ok {
			continue
		}
		switch fsType {
		case "cgroup2":
			// Prefer the canonical location when several are mounted.
			if l.Unified == "" || mountPoint == "/sys/fs/cgroup" {
				l.Unified = mountPoint
			}
		case "cgroup":
			for _, opt := range strings.Split(superOpts, ",") {
				if !isControllerOption(opt) {
					continue
				}
				if _, seen := l.V1[opt]; !seen {
					l.V1[opt] = mountPoint
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Layout{}, fmt.Errorf("parse mountinfo: %w", err)
	}
	switch {
	case l.V1["memory"] != "":
		l.Version = V1
		for _, c := range requiredControllers {
			if l.V1[c] == "" {
				return Layout{}, fmt.Errorf("cgroup v1 controller %q is not mounted: %w", c, errdefs.ErrUnavailable)
			}
		}
	case l.Unified != "":
		l.Version = V2
	default:
		return Layout{}, fmt.Errorf("no cgroup hierarchy with resource controllers is mounted: %w", errdefs.ErrUnavailable)
	}
	return l, nil
}

// isCgroupLine reports whether a mountinfo line's filesystem type (the
// first field after " - ") is cgroup or cgroup2, without allocating.
func isCgroupLine(line []byte) bool {
	_, post, found := bytes.Cut(line, []byte(" - "))
	if !found {
		return false
	}
	fsType, _, _ := bytes.Cut(post, []byte(" "))
	return string(fsType) == "cgroup" || string(fsType) == "cgroup2"
}

// splitMountinfoLine returns the mount point, filesystem type and super
// options of one mountinfo line (see proc(5)).
func splitMountinfoLine(line string) (mountPoint, fsType, superOpts string, ok bool) {
	pre, post, found := strings.Cut(line, " - ")
	if !found {
		return "", "", "", false
	}
	f := strings.Fields(pre)
	p := strings.Fields(post)
	if len(f) < 5 || len(p) < 3 {
		return "", "", "", false
	}
	return mountinfo.Unescape(f[4]), p[0], p[2], true
}

// isControllerOption reports whether a v1 super option names a controller
// or a named hierarchy rather than a mount flag.
func isControllerOption(opt string) bool {
	switch opt {
	case "", "rw", "ro", "xattr", "noprefix", "clone_children", "cpuset_v2_mode", "favordynmods", "nsdelegate":
		return false
	}
	if strings.HasPrefix(opt, "name=") {
		return true
	}
	return !strings.Contains(opt, "=")
}

// validateName checks a cgroup parent (may contain "/") or id (may not).
func validateName(what, name string, allowSlash bool) error {
	if name == "" {
		return fmt.Errorf("cgroup %s is empty: %w", what, errdefs.ErrInvalidArgument)
	}
	if !allowSlash && strings.Contains(name, "/") {
		return fmt.Errorf("cgroup %s %q contains '/': %w", what, name, errdefs.ErrInvalidArgument)
	}
	if strings.HasPrefix(name, "/") {
		return fmt.Errorf("cgroup %s %q is absolute: %w", what, name, errdefs.ErrInvalidArgument)
	}
	for _, el := range strings.Split(name, "/") {
		if el == "" || el == "." || el == ".." {
			return fmt.Errorf("cgroup %s %q has an invalid element %q: %w", what, name, el, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// dirs returns the directories of cgroup rel (relative to each hierarchy's
// root) for the sandbox controllers, keyed by controller. Co-mounted
// controllers (cpu,cpuacct) share a directory.
func (l Layout) dirs(rel string) map[string]string {
	out := map[string]string{}
	if l.Version == V2 {
		out["unified"] = filepath.Join(l.Unified, rel)
		return out
	}
	for _, c := range sandboxControllers {
		if m := l.V1[c]; m != "" {
			out[c] = filepath.Join(m, rel)
		}
	}
	return out
}

// uniqueDirs returns the distinct directories of dirs, sorted.
func uniqueDirs(dirs map[string]string) []string {
	var out []string
	for _, d := range dirs {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// allHierarchyDirs returns, for every mounted hierarchy (v1 controllers,
// named v1 hierarchies and the unified one), the directory of cgroup rel.
func (l Layout) allHierarchyDirs(rel string) []string {
	var out []string
	for _, m := range l.V1 {
		if d := filepath.Join(m, rel); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	if l.Unified != "" {
		out = append(out, filepath.Join(l.Unified, rel))
	}
	slices.Sort(out)
	return out
}

// ancestorsV2 returns the unified-hierarchy directories whose
// cgroup.subtree_control must enable the controllers so that a child of
// parent gets them: the root and every directory down to parent itself.
func ancestorsV2(unified, parent string) []string {
	out := []string{unified}
	cur := unified
	for _, el := range strings.Split(parent, "/") {
		cur = filepath.Join(cur, el)
		out = append(out, cur)
	}
	return out
}
