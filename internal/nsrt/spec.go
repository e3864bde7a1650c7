// Package nsrt is the namespace runtime: it runs a sandbox as an init in its
// own pid, mount, uts, ipc and cgroup namespaces, joined to a network
// namespace made by the networking layer, on an overlayfs over a read-only
// template rootfs, inside a cgroup with limits. Each sandbox is built by a
// detached `cube shim`, which then becomes the sandbox's supervisor (same
// process, after an exec; see packages shim and supervisor), so it
// outlives the agent.
package nsrt

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/atomicfile"
	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/seccomp"
	"github.com/cube-dev/cube/internal/supervisor"
)

// Files and directories nsrt keeps in a sandbox state dir (next to the
// supervisor's shim.json, exit.json, shim.sock and shim.log).
const (
	SpecFile  = "spec.json" // the Spec, written by Start
	InitLog   = "init.log"  // the init's stdout and stderr
	rootfsDir = "rootfs"    // overlay mount point (inside the sandbox's mount namespace only)
	upperDir  = "upper"     // overlay upper layer: everything the sandbox wrote
	workDir   = "work"      // overlay work dir
)

// minDiskSizeMB is the smallest writable layer an ext4 image can hold usefully.
const minDiskSizeMB = 16

// DefaultReadyTimeout bounds how long init may take to signal readiness.
const DefaultReadyTimeout = 10 * time.Second

// ReadyFD is the fd on which the sandbox's init writes a byte once ready.
const ReadyFD = 3

// Bind makes a host file or directory visible inside the sandbox.
type Bind struct {
	Source   string `json:"source"`   // absolute host path
	Target   string `json:"target"`   // absolute path in the sandbox, created if missing
	ReadOnly bool   `json:"readOnly"` // mounted read-only
}

// FileSpec is a file written into the sandbox's writable layer before init runs.
type FileSpec struct {
	Data []byte      `json:"data"`
	Mode os.FileMode `json:"mode"` // 0 means 0644
}

// Spec is the blueprint of one sandbox.
type Spec struct {
	ID       string `json:"id"`
	StateDir string `json:"stateDir"` // exists and is owned by the caller
	Rootfs   string `json:"rootfs"`   // template rootfs, overlay lower, never written
	// NetNSPath is the network namespace to join; "" makes a new empty one.
	NetNSPath string `json:"netnsPath,omitempty"`
	Hostname  string `json:"hostname,omitempty"` // "" means ID
	// Args is the argv of the sandbox's init (pid 1). It writes a byte to fd
	// 3 when ready. Args[0] without a '/' is looked up in the PATH of Env.
	Args         []string            `json:"args"`
	Env          []string            `json:"env,omitempty"`
	Binds        []Bind              `json:"binds,omitempty"`
	Files        map[string]FileSpec `json:"files,omitempty"`
	Resources    cgroup.Resources    `json:"resources"`
	CgroupParent string              `json:"cgroupParent,omitempty"` // "" means cgroup.DefaultParent
	// CgroupLayout is where the cgroup hierarchies are mounted, as the
	// agent read them, when the shim starts in the agent's own mount
	// namespace; nil makes the shim read /proc/self/mountinfo itself (~1 ms
	// with 2000 sandboxes' netns pins on the node).
	CgroupLayout *cgroup.Layout `json:"cgroupLayout,omitempty"`
	ReadyTimeout time.Duration  `json:"readyTimeout,omitempty"` // 0 means DefaultReadyTimeout
	// DiskSizeMB limits the writable layer: > 0 puts it on a filesystem of
	// its own of that size (an ext4 image on a loop device, see disk.go), so
	// filling it gives ENOSPC inside the sandbox; 0 leaves it unlimited on
	// the state dir's filesystem.
	DiskSizeMB int `json:"diskSizeMB,omitempty"`
	// PreparedDisk is an image already formatted with MakeDisk for
	// DiskSizeMB (a warm pool's); it is moved into the state dir instead of
	// formatting one at start. It must be on the state dir's filesystem.
	PreparedDisk string `json:"preparedDisk,omitempty"`
	// UserNS runs the workload in a user namespace mapping its ids 0..Size-1
	// to host ids HostID..; nil runs it in the host's (root inside is root
	// on the host). See userns.go and ResolveUserNS.
	UserNS *UserNS `json:"userNS,omitempty"`
	// Reaper is the argv pid 1 execs when UserNS is set: pid 1 stays in the
	// host's user namespace and must only reap, exiting with the status of
	// its child whose pid is in $CUBE_REAP_PID (the workload, Args). envd
	// does (envd/reaper). Empty: sandbox-init itself stays pid 1 as reaper.
	Reaper []string `json:"reaper,omitempty"`
	// UsernsExec is the host path of cube-nsexec, which starts the workload
	// when UserNS is set (see nsexec.go); "" looks for it next to the
	// running binary, and without it the workload's first process is a
	// second sandbox-init.
	UsernsExec string `json:"usernsExec,omitempty"`
	// Seccomp tunes the syscall filter; nil is the default policy.
	Seccomp *Seccomp `json:"seccomp,omitempty"`
}

// Seccomp tunes a sandbox's syscall filter (see internal/seccomp).
type Seccomp struct {
	// Log makes the kernel log each refused call (audit type 1326) with
	// the caller's host pid; the calls still fail the same way.
	Log bool `json:"log,omitempty"`
	// Allow lists syscalls allowed on top of the default policy.
	Allow []string `json:"allow,omitempty"`
	// Filters, when set, are Log and Allow compiled by the node agent
	// (once per choice per process, see CompiledSeccomp): sandbox-init
	// installs them as they are. Without them (specs written before they
	// existed) sandbox-init compiles Log and Allow itself.
	Filters []SeccompFilter `json:"filters,omitempty"`
}

// SeccompFilter is one compiled filter of a Seccomp.
type SeccompFilter struct {
	Code string `json:"code"` // seccomp.EncodeProgram
	Log  bool   `json:"log,omitempty"`
}

// CompiledSeccomp is the Seccomp of the filter choice (log, allow) with
// its filters compiled; each distinct choice is compiled once per process.
func CompiledSeccomp(log bool, allow []string) (*Seccomp, error) {
	fs, err := seccomp.Filters(seccomp.Options{Log: log, ExtraAllowed: allow})
	if err != nil {
		return nil, err
	}
	sc := &Seccomp{Log: log, Allow: allow}
	for _, f := range fs {
		sc.Filters = append(sc.Filters, SeccompFilter{Code: seccomp.EncodeProgram(f.Prog), Log: f.Log})
	}
	return sc, nil
}

// install installs s's filter: the compiled Filters, else the choice
// compiled here (nil s: the default policy).
func (s *Seccomp) install() error {
	fs, err := s.filters()
	if err != nil {
		return err
	}
	return seccomp.InstallFilters(fs)
}

// filters are the filters install installs, in order.
func (s *Seccomp) filters() ([]seccomp.Filter, error) {
	if s == nil || len(s.Filters) == 0 {
		return seccomp.Filters(s.options())
	}
	return s.decode()
}

func (s *Seccomp) decode() ([]seccomp.Filter, error) {
	var fs []seccomp.Filter
	for i, f := range s.Filters {
		prog, err := seccomp.DecodeProgram(f.Code)
		if err != nil {
			return nil, fmt.Errorf("seccomp filter %d: %w", i, err)
		}
		fs = append(fs, seccomp.Filter{Prog: prog, Log: f.Log})
	}
	return fs, nil
}

// options is the filter choice of s (nil: the default).
func (s *Seccomp) options() seccomp.Options {
	if s == nil {
		return seccomp.Options{}
	}
	return seccomp.Options{Log: s.Log, ExtraAllowed: s.Allow}
}

// withDefaults fills the zero fields that have defaults.
func (s Spec) withDefaults() Spec {
	if s.Hostname == "" {
		s.Hostname = s.ID
	}
	if s.CgroupParent == "" {
		s.CgroupParent = cgroup.DefaultParent
	}
	if s.ReadyTimeout == 0 {
		s.ReadyTimeout = DefaultReadyTimeout
	}
	return s
}

// Validate checks the spec without touching the host beyond stat calls.
func (s Spec) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("sandbox spec: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if s.ID == "" || strings.ContainsAny(s.ID, "/\x00") || s.ID == "." || s.ID == ".." {
		return bad("invalid id %q", s.ID)
	}
	if len(s.Hostname) > 64 {
		return bad("hostname %q longer than 64 bytes", s.Hostname)
	}
	for name, p := range map[string]string{"state dir": s.StateDir, "rootfs": s.Rootfs} {
		if !filepath.IsAbs(p) {
			return bad("%s %q is not an absolute path", name, p)
		}
		// overlayfs options separate with ',' and ':'.
		if strings.ContainsAny(p, ",:\n\x00") {
			return bad("%s %q contains ',' or ':'", name, p)
		}
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return bad("%s %q is not a directory", name, p)
		}
	}
	if s.NetNSPath != "" && !filepath.IsAbs(s.NetNSPath) {
		return bad("netns path %q is not absolute", s.NetNSPath)
	}
	if len(s.Args) == 0 || s.Args[0] == "" {
		return bad("no init argv")
	}
	for _, b := range s.Binds {
		if !filepath.IsAbs(b.Source) || !filepath.IsAbs(b.Target) {
			return bad("bind %q -> %q: paths must be absolute", b.Source, b.Target)
		}
		if _, err := os.Stat(b.Source); err != nil {
			return bad("bind source %q: %v", b.Source, err)
		}
	}
	for p := range s.Files {
		if !filepath.IsAbs(p) || filepath.Clean(p) == "/" {
			return bad("file %q: path must be absolute and not /", p)
		}
	}
	if s.ReadyTimeout < 0 {
		return bad("negative ready timeout")
	}
	if s.DiskSizeMB < 0 {
		return bad("negative disk size %d MB", s.DiskSizeMB)
	}
	if s.DiskSizeMB > 0 && s.DiskSizeMB < minDiskSizeMB {
		return bad("disk size %d MB is below the minimum of %d MB", s.DiskSizeMB, minDiskSizeMB)
	}
	if err := s.UserNS.validate(); err != nil {
		return bad("%v", err)
	}
	if s.Seccomp != nil && len(s.Seccomp.Allow) > 0 {
		if _, err := seccomp.Program(s.Seccomp.options()); err != nil {
			return bad("%v", err)
		}
	}
	if s.Seccomp != nil {
		if _, err := s.Seccomp.decode(); err != nil {
			return bad("%v", err)
		}
	}
	return s.Resources.Validate()
}

func writeSpec(s Spec) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	// The spec may carry secrets (envd token in Files), hence 0600. Only
	// the shim and sandbox-init read it, right after this, in this boot:
	// no fsync (see atomicfile.Replace).
	return atomicfile.Replace(filepath.Join(s.StateDir, SpecFile), b, 0o600)
}

func readSpec(stateDir string) (Spec, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, SpecFile))
	if err != nil {
		return Spec{}, fmt.Errorf("read sandbox spec: %w", err)
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return Spec{}, fmt.Errorf("parse sandbox spec: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	return s, nil
}

// logTail returns the last n bytes of the init log, for error messages.
func logTail(stateDir string, n int64) string {
	s, _ := InitLogTail(stateDir, n)
	return strings.TrimSpace(s)
}

// InitLogTail returns the last n bytes of the sandbox's init log (its pid
// 1's and envd's stderr) in stateDir, and whether they start mid-file.
func InitLogTail(stateDir string, n int64) (tail string, cut bool) {
	return supervisor.LogTail(filepath.Join(stateDir, InitLog), n)
}

// openCgroup returns a handle on the sandbox's cgroup, in the layout the
// agent passed when there is one.
func (s Spec) openCgroup() (*cgroup.Cgroup, error) {
	if s.CgroupLayout != nil {
		return cgroup.OpenLayout(*s.CgroupLayout, s.CgroupParent, s.ID)
	}
	return cgroup.Open(s.CgroupParent, s.ID)
}
