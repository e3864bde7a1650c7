package cubelet

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/exepath"
	"github.com/cube-dev/cube/internal/mountns"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/supervisor"
)

// Where the long-lived processes live. Every sandbox's shim (then its
// supervisor) and init are started by the cubelet but outlive it, and they
// inherit its mount namespace. In a container (the chart's cube-node Pod)
// that namespace holds the container's root file system: a shim started
// there, from the image's binary, keeps the old image mounted and running
// long after the Pod was replaced. So when the cubelet runs in a mount
// namespace other than the host's, shims start in the host's
// (Config.HostMountNS, mountns.FindHost) from a binary on a host path:
// cube-shim next to envd, in the directory the chart's installer fills
// (/var/lib/cube/artifacts). The paths the shim and the sandbox use (state
// dir, templates, envd, reaper, netns pins) must then name the same files on
// both sides; New checks that and says which volume is missing otherwise.
// On a host (cube up, a cubelet without a container) nothing changes.

// Host mount namespace modes (Config.HostMountNS); anything else is the
// path of a mount namespace file.
const (
	HostMountNSAuto = "auto"
	HostMountNSOff  = "off"
)

// ShimName is the runtime binary looked for next to envd when shims start
// in the host's mount namespace.
const ShimName = "cube-shim"

// RuntimeFile, in the node state dir, records the runtime the running
// cubelet starts sandboxes with, for `cube node doctor`.
const RuntimeFile = "runtime.json"

// RuntimeInfo is the runtime sandboxes and pool slots are started with.
type RuntimeInfo struct {
	// Version is the cubelet's.
	Version string `json:"version"`
	// Stamp is Version plus the identity of the binaries below: a warm-pool
	// slot made under another stamp is dropped and made anew.
	Stamp      string `json:"stamp"`
	Shim       string `json:"shim"`
	Supervisor string `json:"supervisor"`
	// SupervisorFile identifies the supervisor binary (device, inode), so a
	// live supervisor's /proc/<pid>/exe tells whether it runs this one.
	SupervisorFile mountns.ID `json:"supervisorFile"`
	// MountNS is where the shims' mount namespace was found ("" when they
	// start in the cubelet's own), MountNSID identifies it.
	MountNS   string     `json:"mountNS,omitempty"`
	MountNSID mountns.ID `json:"mountNSID"`
	Envd      string     `json:"envd"`
	Reaper    string     `json:"reaper,omitempty"`
	Since     time.Time  `json:"since"`
}

// ReadRuntime reads the runtime record of the node whose state dir is
// stateDir (ErrNotFound when no cubelet of this version started there).
func ReadRuntime(stateDir string) (RuntimeInfo, error) {
	var ri RuntimeInfo
	b, err := os.ReadFile(filepath.Join(stateDir, RuntimeFile))
	if errors.Is(err, fs.ErrNotExist) {
		return ri, fmt.Errorf("%s: %w", RuntimeFile, errdefs.ErrNotFound)
	}
	if err != nil {
		return ri, err
	}
	if err := json.Unmarshal(b, &ri); err != nil {
		return ri, fmt.Errorf("parse %s: %w: %w", RuntimeFile, errdefs.ErrInvalidArgument, err)
	}
	return ri, nil
}

// openShimNS opens the mount namespace shims start in for mode, or nil for
// the cubelet's own.
func openShimNS(mode string) (*mountns.NS, error) {
	path := mode
	switch mode {
	case HostMountNSOff:
		return nil, nil
	case "", HostMountNSAuto:
		p, err := mountns.FindHost()
		if err != nil || p == "" {
			return nil, err
		}
		path = p
	}
	ns, err := mountns.Open(path)
	if err != nil {
		return nil, fmt.Errorf("host mount namespace: %w (set --host-mount-ns=off to keep shims in the cubelet's own)", err)
	}
	if self, err := mountns.Self(); err == nil && self == ns.ID() {
		ns.Close() // the cubelet is in it already
		return nil, nil
	}
	return ns, nil
}

// setUpRuntime decides where shims start and from which binary, checks
// that the paths they use are shared with that mount namespace, and
// records the result (RuntimeFile). It runs in New, after the dataplane is
// open (its netns pin shows whether pins reach the host).
func (c *Cubelet) setUpRuntime() error {
	ns, err := openShimNS(c.cfg.HostMountNS)
	if err != nil {
		return err
	}
	c.shimNS = ns
	ri := RuntimeInfo{Version: c.cfg.Version, Shim: c.cfg.Exe, Envd: c.cfg.EnvdPath, Reaper: c.cfg.ReaperPath, Since: time.Now().UTC()}
	if ns != nil {
		ri.MountNS = ns.Path()
		if ri.Shim, err = c.hostShim(ns); err != nil {
			return err
		}
		if err := c.checkShared(ns, ri.Shim); err != nil {
			return err
		}
		ri.MountNSID = ns.ID()
	} else if ri.MountNSID, err = mountns.Self(); err != nil {
		return err
	}
	c.shimExe = ri.Shim
	c.setRuntime(c.runtimeFiles(ri))
	c.log.Info("sandbox runtime", "shim", ri.Shim, "supervisor", ri.Supervisor, "stamp", ri.Stamp,
		"mountNS", cmp.Or(ri.MountNS, "the cubelet's own"))
	return nil
}

// hostShim picks the shim binary for shims started in ns: Config.Exe when
// it is the same file there (a cubelet on the host in a private mount
// namespace), else cube-shim next to envd (the installer's host directory).
func (c *Cubelet) hostShim(ns *mountns.NS) (string, error) {
	cands := []string{c.cfg.Exe}
	if p, ok := exepath.Sibling(c.cfg.EnvdPath, ShimName); ok {
		cands = append(cands, p)
	}
	for _, p := range cands {
		if same, err := ns.Same(p); err == nil && same[0] {
			return p, nil
		}
	}
	return "", fmt.Errorf("shims start in the host mount namespace (%s) from a binary on a host path, and no candidate is the same file there (%s): install %s next to envd on the host (the chart's installer puts it in /var/lib/cube/artifacts) or set --host-mount-ns=off: %w",
		ns.Path(), strings.Join(cands, ", "), ShimName, errdefs.ErrFailedPrecondition)
}

// checkShared fails unless every path a shim or sandbox uses names the same
// file in ns as here: the node state dir, envd, the reaper, the shim's
// directory, the templates (or the nearest existing parent) and the
// dataplane's netns pin, which is the same only when pins made here
// propagate to the host (mountPropagation: Bidirectional).
func (c *Cubelet) checkShared(ns *mountns.NS, shimExe string) error {
	paths := []string{c.cfg.StateDir, c.cfg.EnvdPath, filepath.Dir(shimExe)}
	if c.cfg.ReaperPath != "" {
		paths = append(paths, c.cfg.ReaperPath)
	}
	if c.templates != nil {
		paths = append(paths, existingParent(c.templates.Dir))
	}
	pin := c.cfg.Network.DataplanePin()
	if _, err := os.Stat(pin); err == nil {
		paths = append(paths, pin)
	}
	same, err := ns.Same(paths...)
	if err != nil {
		return fmt.Errorf("check paths in the host mount namespace %s: %w", ns.Path(), err)
	}
	var bad []string
	for i, ok := range same {
		if !ok {
			bad = append(bad, paths[i])
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("shims start in the host mount namespace (%s), where %s is not the same file as here: mount it from the host at the same path (netns pins under the run dir need mountPropagation: Bidirectional), or set --host-mount-ns=off: %w",
		ns.Path(), strings.Join(bad, ", "), errdefs.ErrFailedPrecondition)
}

// existingParent is dir or its nearest ancestor that exists.
func existingParent(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || dir == "/" || dir == "." {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

// runtimeFiles completes ri with the supervisor binary and the stamp, from
// the binaries as they are on disk now.
func (c *Cubelet) runtimeFiles(ri RuntimeInfo) RuntimeInfo {
	ri.Supervisor = ri.Shim // its `supervise` subcommand
	if p, ok := exepath.Sibling(ri.Shim, supervisor.BinaryName); ok {
		ri.Supervisor = p
	}
	ri.SupervisorFile, _ = mountns.IDOf(ri.Supervisor)
	ri.Stamp = runtimeStamp(ri.Version, ri.Shim, ri.Supervisor, ri.Envd, ri.Reaper)
	return ri
}

// runtimeStamp is version plus a digest of the files' identities (path,
// device, inode, size, modification time): an installer or a build that
// replaces a binary changes it, without reading megabytes at every start.
func runtimeStamp(version string, files ...string) string {
	h := sha256.New()
	for _, f := range files {
		if f == "" {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(f, &st); err != nil {
			fmt.Fprintf(h, "%s missing\n", f)
			continue
		}
		fmt.Fprintf(h, "%s %d %d %d %d\n", f, st.Dev, st.Ino, st.Size, st.Mtim.Nano())
	}
	return version + "+" + hex.EncodeToString(h.Sum(nil))[:12]
}

// setRuntime makes ri current and records it for operator tools.
func (c *Cubelet) setRuntime(ri RuntimeInfo) {
	c.runtime.Store(&ri)
	if err := atomicfile.WriteJSON(filepath.Join(c.cfg.StateDir, RuntimeFile), ri, 0o644); err != nil {
		c.log.Warn("record sandbox runtime", "err", err)
	}
}

// stamp is the current runtime stamp ("" before setUpRuntime: offline
// tools keep every slot).
func (c *Cubelet) stamp() string {
	if ri := c.runtime.Load(); ri != nil {
		return ri.Stamp
	}
	return ""
}

// refreshRuntime notices binaries replaced while the cubelet runs (the
// chart's installer rolls without recreating cube-node): new shims run the
// new files anyway; pool slots made from the old ones are dropped and made
// anew. It runs with the maintenance loop.
func (c *Cubelet) refreshRuntime() {
	cur := c.runtime.Load()
	if cur == nil {
		return
	}
	next := c.runtimeFiles(*cur)
	if next.Stamp == cur.Stamp {
		return
	}
	next.Since = time.Now().UTC()
	c.setRuntime(next)
	n := c.recyclePool(next.Stamp)
	c.log.Info("sandbox runtime binaries changed; recycling warm-pool slots", "stamp", next.Stamp, "slots", n)
}

// startSandbox starts spec's sandbox through a shim, in the shims' mount
// namespace. The disk step has made spec's disk already (with the tools
// the cubelet ships with, not the host's mkfs.ext4 a shim on the host
// would find).
func (c *Cubelet) startSandbox(ctx context.Context, spec nsrt.Spec) (*nsrt.Sandbox, error) {
	return nsrt.StartIn(ctx, c.shimNS, c.shimExe, spec)
}
