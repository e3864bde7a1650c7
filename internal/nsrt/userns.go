package nsrt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

)

// A sandbox with Spec.UserNS runs its workload in a user namespace: root
// inside is an unprivileged host id. sandbox-init (pid 1, host root, the
// host's user namespace) still builds the root filesystem, so every mount,
// and the pid, uts, ipc, net and cgroup namespaces, stay owned by the host's
// user namespace: root inside holds capabilities over none of them.
//
//  1. pid 1 starts the workload's process (B) first thing, in a new user
//     namespace with the spec's mapping; B blocks on a socket. pid 1 was
//     forked into the sandbox cgroup, so B starts there too (where the shim
//     had to move pid 1 instead, pid 1 moves B after it).
//  2. pid 1 clones the template (lower layer) and the writable layer (the
//     sandbox disk, or the state dir) as detached mounts idmapped through
//     B's user namespace (open_tree, mount_setattr(MOUNT_ATTR_IDMAP),
//     move_mount), so host-root-owned template files appear as root inside,
//     and files root inside writes are stored as uid 0 on the layer.
//  3. pid 1 mounts the overlay over the idmapped layers with its fsuid and
//     fsgid set to the mapped root (overlayfs works on its layers with the
//     mounter's credentials, which must map through the idmap), pivots
//     (which moves B's root and cwd too), writes files, binds and mounts
//     /proc, /sys and /dev as without a user namespace.
//  4. pid 1 sends B the resolved argv; B hardens itself (capabilities,
//     no_new_privs, seccomp; all of these are per process) and execs the
//     workload. pid 1 drops every capability, hardens itself the same way and
//     execs the reaper (Spec.Reaper), or reaps itself.

// UserNS maps a sandbox's user and group ids 0..Size-1 to the host ids
// HostID..HostID+Size-1 (the same range for both).
type UserNS struct {
	HostID uint32 `json:"hostID"`
	Size   uint32 `json:"size"`
}

// Host id ranges handed out by UserNSForSlot: UserNSSlots ranges of
// UserNSSize ids from UserNSBase, so every host id stays below 2^31 (the
// upper bound of net.ipv4.ping_group_range, and of signed 32-bit ids).
const (
	UserNSSize  = 65536
	UserNSBase  = 1 << 30
	UserNSSlots = (1<<31 - UserNSBase) / UserNSSize // 16384
)

// UserNSForSlot returns the mapping of the sandbox in slot (a per-node
// index unique among its running sandboxes, e.g. its IP's offset in the
// node CIDR). Slots past UserNSSlots wrap around and then share a range.
func UserNSForSlot(slot int) *UserNS {
	s := uint32(slot) % UserNSSlots
	return &UserNS{HostID: UserNSBase + s*UserNSSize, Size: UserNSSize}
}

func (u *UserNS) validate() error {
	switch {
	case u == nil:
		return nil
	case u.Size == 0:
		return errors.New("user namespace: empty id range")
	case u.HostID == 0:
		return errors.New("user namespace: host id 0 would map root to root")
	case uint64(u.HostID)+uint64(u.Size) > 1<<32-1: // (uid_t)-1 is never valid
		return fmt.Errorf("user namespace: host ids %d+%d pass 2^32-2", u.HostID, u.Size)
	}
	return nil
}

// Flags of `sandbox-init` for the processes of a user-namespaced sandbox.
const usernsChildFlag = "--userns-child" // B: wait for the exec request, harden, exec

// ReapPIDEnv carries the pid of the workload to the reaper (Spec.Reaper).
const ReapPIDEnv = "CUBE_REAP_PID"

// releaseFD is B's end of the socket on which pid 1 sends the exec request.
const releaseFD = 4

// execRequest is what pid 1 tells B to exec once the root is ready.
type execRequest struct {
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
	// Seccomp is the spec's filter choice (B does not read the spec).
	Seccomp *Seccomp `json:"seccomp,omitempty"`
}

// pidfdGetUserNS is PIDFD_GET_USER_NAMESPACE (_IO(0xFF, 9), kernel 6.11+).
const pidfdGetUserNS = 0xFF09

// usernsChild is B, seen from pid 1.
type usernsChild struct {
	u       *UserNS
	cmd     *exec.Cmd
	release *os.File // pid 1's end of the release socket
	nsFD    int      // B's user namespace
	native  bool     // B is cube-nsexec (nsexec.go), not a second sandbox-init
}

// startUsernsChild starts B in a new user namespace with u's mapping, as
// uid and gid 0 inside; B inherits the ready fd (3) and the release socket
// (4).
//
// It runs on a thread of its own, first thing, while pid 1 waits for the
// shim (the Go runtime of B starts meanwhile), so B starts outside pid 1's
// cgroup namespace, which pid 1 makes only once released: B unshares a
// cgroup namespace itself. B starts in pid 1's cgroup, the sandbox's
// (unless the shim had to move pid 1 there: then pid 1 moves B too,
// joinCgroup). B dies
// with pid 1 (the kernel kills a pid namespace with its init), so it needs
// no Pdeathsig, which would tie it to the forking thread.
func startUsernsChild(u *UserNS) (_ *usernsChild, err error) {
	// One socket carries "started" from B (before pivot_root: a dynamically
	// linked B loads its libraries from the host's root) and the exec
	// request from pid 1, whose EOF releases B.
	cmd, w, err := usernsChildCmd("/proc/self/exe", os.Args[0], InitCommand, usernsChildFlag)
	if err != nil {
		return nil, err
	}
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.HostID), Size: int(u.Size)}}
	pidfd := -1
	// One P, like pid 1 (initEnv); B execs the workload with Spec.Env.
	cmd.Env = []string{"GOMAXPROCS=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: idmap, GidMappings: idmap,
		// envd runs commands as other users with their groups.
		GidMappingsEnableSetgroups: true,
		// Become root of the new namespace (the mapped host id): without
		// this B would keep host uid 0 in it.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		PidFD:      &pidfd,
	}
	if err := startUsernsChildCmd(cmd, w); err != nil {
		return nil, fmt.Errorf("start the workload in a user namespace (clone CLONE_NEWUSER): %w", err)
	}
	c := &usernsChild{u: u, cmd: cmd, release: w, nsFD: -1}
	defer func() {
		if err != nil {
			c.abort()
		}
	}()
	if pidfd >= 0 {
		defer unix.Close(pidfd)
	}
	if c.nsFD, err = userNSOf(cmd.Process.Pid, pidfd); err != nil {
		return nil, err
	}
	return c, nil
}

// usernsChildCmd is B's command (path, argv0 and args) with its end of a
// new release socket on fd 4 and the ready fd on 3; w is pid 1's end.
func usernsChildCmd(path, argv0 string, args ...string) (cmd *exec.Cmd, w *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	w, r := os.NewFile(uintptr(fds[0]), "release"), os.NewFile(uintptr(fds[1]), "release")
	cmd = exec.Command(path, args...)
	cmd.Args[0] = argv0
	cmd.Dir = "/" // moved into the new root by pivot_root, like B's root
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{os.NewFile(ReadyFD, "ready"), r}
	return cmd, w, nil
}

// startUsernsChildCmd starts cmd (from usernsChildCmd) and closes pid 1's
// copy of B's socket end; on failure w too.
func startUsernsChildCmd(cmd *exec.Cmd, w *os.File) error {
	err := cmd.Start()
	cmd.ExtraFiles[1].Close()
	if err != nil {
		w.Close()
	}
	return err
}

// startUsernsChildAsync starts B (startUsernsChild) on another thread.
// os/exec writes B's id maps to /proc/<pid>/ with B's pid in this pid
// namespace, so /proc is first made this namespace's, not the host's (the
// mount is private to the sandbox and goes with the old root); mounts must
// already be private.
//
// With nsexec (the path of cube-nsexec), B is that binary (nsexec.go).
func startUsernsChildAsync(u *UserNS, nsexec string) (<-chan childResult, error) {
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mount the sandbox's /proc: %w", err)
	}
	c := make(chan childResult, 1)
	go func() {
		start := startUsernsChild
		if nsexec != "" {
			start = func(u *UserNS) (*usernsChild, error) { return startNativeChild(u, nsexec) }
		}
		child, err := start(u)
		c <- childResult{child, err}
	}()
	return c, nil
}

type childResult struct {
	child *usernsChild
	err   error
}

// joinCgroup moves B into the sandbox cgroup, where the shim moved pid 1
// after B started (syncMoved).
func (c *usernsChild) joinCgroup(spec Spec) error {
	cg, err := spec.openCgroup()
	if err != nil {
		return err
	}
	if err := cg.AddProc(c.cmd.Process.Pid); err != nil {
		return fmt.Errorf("put the workload into the sandbox cgroup: %w", err)
	}
	return nil
}

// userNSOf opens the user namespace of the child pid (pidfd, when >= 0,
// refers to it).
func userNSOf(pid, pidfd int) (int, error) {
	if pidfd >= 0 {
		if fd, err := unix.IoctlRetInt(pidfd, pidfdGetUserNS); err == nil {
			unix.CloseOnExec(fd)
			return fd, nil
		}
		// Older kernel: find the pid in /proc's (the host's) namespace.
		if b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd)); err == nil {
			if p, ok := fdinfoPid(string(b)); ok {
				pid = p
			}
		}
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the workload's user namespace: %w", err)
	}
	return fd, nil
}

// fdinfoPid returns the "Pid:" line of a pidfd's fdinfo.
func fdinfoPid(s string) (int, bool) {
	for line := range strings.Lines(s) {
		if v, ok := strings.CutPrefix(line, "Pid:"); ok {
			p, err := strconv.Atoi(strings.TrimSpace(v))
			return p, err == nil && p > 0
		}
	}
	return 0, false
}

// abort ends B before it ran anything: EOF on its socket, then SIGKILL.
func (c *usernsChild) abort() {
	c.release.Close()
	if c.nsFD >= 0 {
		unix.Close(c.nsFD)
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// waitStarted blocks until B runs its own code (or has died). cube-nsexec
// did before it was returned (it made its user namespace).
func (c *usernsChild) waitStarted() error {
	if c.native {
		return nil
	}
	var b [1]byte
	if n, err := c.release.Read(b[:]); n != 1 {
		return fmt.Errorf("the workload's process did not start: %w", err)
	}
	return nil
}

// run sends B the exec request and lets it go; pid 1's copy of the ready
// fd is closed so that only the workload holds it.
func (c *usernsChild) run(req execRequest) error {
	unix.Close(c.nsFD)
	c.nsFD = -1
	var b []byte
	var err error
	if c.native {
		b, err = encodeNsexecRequest(req, SandboxCapabilities)
	} else {
		b, err = json.Marshal(req)
	}
	if err != nil {
		return err
	}
	_, err = c.release.Write(b)
	if cerr := c.release.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("release the workload: %w", err)
	}
	return unix.Close(ReadyFD)
}

// idmapLayers clones the template and the writable layer as idmapped
// mounts on state dir staging points and returns their paths.
func (c *usernsChild) idmapLayers(stateDir, rootfs, layer string) (lower, upperLayer string, err error) {
	lower = filepath.Join(stateDir, idmapLowerDir)
	upperLayer = filepath.Join(stateDir, idmapLayerDir)
	if err := idmapMount(c.nsFD, rootfs, lower, true); err != nil {
		return "", "", fmt.Errorf("idmap template %s: %w", rootfs, err)
	}
	if err := idmapMount(c.nsFD, layer, upperLayer, false); err != nil {
		return "", "", fmt.Errorf("idmap writable layer %s: %w", layer, err)
	}
	return lower, upperLayer, nil
}

// Staging mount points (in the state dir, visible in the sandbox's mount
// namespace only) of the idmapped layers.
const (
	idmapLowerDir = "idmap-lower"
	idmapLayerDir = "idmap-layer"
)

// idmapMount mounts a copy of the directory src on dst (made if missing),
// idmapped through the user namespace nsFD and read-only when asked.
func idmapMount(nsFD int, src, dst string, readOnly bool) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(nsFD)}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr(MOUNT_ATTR_IDMAP): %w", err)
	}
	if dst == "" {
		return nil // a probe: the detached copy goes with fd
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// asMappedRoot makes the calling (locked) thread create files as the
// sandbox's root: fsuid becomes u.HostID and fsgid gid (normally the same), which the idmapped
// layers store as 0. The kernel clears the file capabilities from the
// effective set when fsuid leaves 0; they are raised again. The returned
// function goes back to host root.
func asMappedRoot(u *UserNS, gid uint32) (restore func(), err error) {
	restore = func() {
		_ = unix.Setfsuid(0)
		_ = unix.Setfsgid(0)
	}
	_ = unix.Setfsgid(int(gid))
	_ = unix.Setfsuid(int(u.HostID))
	if prev, _ := unix.SetfsuidRetUid(int(u.HostID)); prev != int(u.HostID) {
		restore()
		return nil, fmt.Errorf("setfsuid %d did not take", u.HostID)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		restore()
		return nil, fmt.Errorf("capget: %w", err)
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		restore()
		return nil, fmt.Errorf("raise file capabilities: %w", err)
	}
	return restore, nil
}

// usernsChildMain is B's body: wait for pid 1's exec request (EOF means
// the start was aborted), harden and exec the workload. It runs as root
// of the sandbox's user namespace, already inside the new root.
func usernsChildMain() error {
	release := os.NewFile(releaseFD, "release")
	if _, err := release.Write([]byte{1}); err != nil {
		return fmt.Errorf("tell pid 1 the workload started: %w", err)
	}
	b, err := io.ReadAll(release)
	release.Close()
	if err != nil || len(b) == 0 {
		return errors.New("pid 1 aborted the start")
	}
	var req execRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return fmt.Errorf("exec request: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	// B is in the sandbox cgroup (born there, or moved by pid 1): root
	// the namespace there.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-init: workload: no cgroup namespace: %v\n", err)
	}
	if err := dropPrivileges(SandboxCapabilities, req.Seccomp); err != nil {
		return err
	}
	if err := unix.Exec(req.Path, req.Args, req.Env); err != nil {
		return fmt.Errorf("exec %s: %w", req.Path, err)
	}
	return nil
}
