package nsrt

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/errdefs"
)

// UserNSMode is the node's choice for sandbox user namespaces.
type UserNSMode string

const (
	// UserNSAuto uses a user namespace where the kernel allows it (see
	// ProbeUserNS) and runs sandboxes without one elsewhere, with a warning.
	UserNSAuto UserNSMode = "auto"
	// UserNSOn refuses to create a sandbox without a user namespace.
	UserNSOn UserNSMode = "on"
	// UserNSOff never uses one: root inside is root on the host.
	UserNSOff UserNSMode = "off"
)

// ParseUserNSMode parses auto, on or off ("" means auto).
func ParseUserNSMode(s string) (UserNSMode, error) {
	switch m := UserNSMode(s); m {
	case "":
		return UserNSAuto, nil
	case UserNSAuto, UserNSOn, UserNSOff:
		return m, nil
	}
	return "", fmt.Errorf("user namespace mode %q: want auto, on or off: %w", s, errdefs.ErrInvalidArgument)
}

// minUserNSKernel is the first kernel whose overlayfs takes idmapped layers.
var minUserNSKernel = [2]int{5, 19}

// ProbeUserNS reports whether this kernel can run a sandbox in a user
// namespace over the given directories (the template and the state dir):
// overlayfs over idmapped layers (5.19+), a user namespace can be made
// (user.max_user_namespaces, LSM policies), and each directory's
// filesystem accepts an idmapped mount. It leaves nothing behind.
func ProbeUserNS(dirs ...string) error {
	if major, minor, ok := kernelVersion(); ok && (major < minUserNSKernel[0] ||
		major == minUserNSKernel[0] && minor < minUserNSKernel[1]) {
		return fmt.Errorf("kernel %d.%d: overlayfs over idmapped layers needs %d.%d", major, minor, minUserNSKernel[0], minUserNSKernel[1])
	}
	// The holder process stops (ptrace) at its exec, before running any
	// code; the tracer is this thread until it is killed and reaped.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	u := UserNSForSlot(0)
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(u.HostID), Size: int(u.Size)}}
	pidfd := -1
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"cube-userns-probe"}, &syscall.ProcAttr{
		Env: []string{},
		Sys: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER, UidMappings: idmap, GidMappings: idmap,
			Ptrace: true, Pdeathsig: syscall.SIGKILL, PidFD: &pidfd,
		},
	})
	if err != nil {
		return fmt.Errorf("create a user namespace (clone CLONE_NEWUSER): %w", err)
	}
	defer func() {
		_ = unix.Kill(pid, unix.SIGKILL)
		for {
			var ws unix.WaitStatus
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || ws.Exited() || ws.Signaled() {
				return
			}
		}
	}()
	if pidfd >= 0 {
		defer unix.Close(pidfd)
	}
	nsFD, err := userNSOf(pid, pidfd)
	if err != nil {
		return err
	}
	defer unix.Close(nsFD)
	for _, d := range dirs {
		if err := idmapMount(nsFD, d, "", false); err != nil {
			return fmt.Errorf("idmapped mount of %s: %w", d, err)
		}
	}
	return nil
}

// kernelVersion returns the running kernel's major and minor version.
func kernelVersion() (major, minor int, ok bool) {
	var uts unix.Utsname
	if unix.Uname(&uts) != nil {
		return 0, 0, false
	}
	parts := strings.SplitN(unix.ByteSliceToString(uts.Release[:]), ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	digits := func(s string) string {
		if i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			return s[:i]
		}
		return s
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(digits(parts[1]))
	return major, minor, err1 == nil && err2 == nil
}

// probeUserNS is ProbeUserNS; tests replace it.
var probeUserNS = ProbeUserNS

// probes caches ProbeUserNS per pair of filesystems (template, state dir),
// and whether the fallback was logged.
var probes = struct {
	sync.Mutex
	results map[string]error
	warned  map[string]bool
}{results: map[string]error{}, warned: map[string]bool{}}

// ResolveUserNS decides whether a sandbox with template rootfs and state
// dir stateDir runs in a user namespace under mode, and returns the
// Spec.UserNS for it (nil: none) with slot choosing the id range (see
// UserNSForSlot). auto probes once per pair of filesystems and, where the
// answer is no, returns nil and logs a warning once; on returns that
// answer as an ErrFailedPrecondition error.
func ResolveUserNS(log *slog.Logger, mode UserNSMode, slot int, rootfs, stateDir string) (*UserNS, error) {
	mode, err := ParseUserNSMode(string(mode))
	if err != nil || mode == UserNSOff {
		return nil, err
	}
	key := devKey(rootfs) + "," + devKey(stateDir)
	var done bool
	probes.Lock()
	defer probes.Unlock()
	err, done = probes.results[key]
	if !done {
		err = probeUserNS(rootfs, stateDir)
		probes.results[key] = err
	}
	switch {
	case err == nil:
		return UserNSForSlot(slot), nil
	case mode == UserNSOn:
		return nil, fmt.Errorf("user namespace required (--userns on) but unavailable: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if !probes.warned[key] && log != nil {
		probes.warned[key] = true
		log.Warn("sandboxes run without a user namespace: root inside is root on the host", "reason", err.Error(), "template", rootfs)
	}
	return nil, nil
}

// devKey names the filesystem holding path (its device number).
func devKey(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return path
	}
	return strconv.FormatUint(st.Dev, 10)
}
