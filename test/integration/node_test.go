package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubelet"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/proctest"
	"github.com/cube-dev/cube/internal/template"
)

// node is one Cube node (data dir, run dir, dataplane names, cgroup parent)
// served by successive `cube up` processes. Every name and range is unique
// to the test, so tests never meet each other's or a real Cube's state.
type node struct {
	t          *testing.T
	dir        string // short temp dir (unix socket paths must stay < 108 bytes)
	net        cubevs.Config
	cgroup     string
	key        string
	listen     string
	exe        string   // cube binary to run
	extra      []string // extra `cube up` flags
	podNS      string   // when set, cube up runs inside this pinned netns
	hostNetNS  string   // --host-netns
	proc       *exec.Cmd
	exited     chan struct{}
	logf       *os.File
	startedAt  time.Time
	httpClient *http.Client

	envdPath string // --envd (default bins.envd)
	// image, when set, runs cube up like the chart's cube-node container:
	// in a mount namespace of its own, from a copy of the cube binary (and
	// image.shim next to it) on a tmpfs mounted on image.dir, which the
	// host does not see (see hostmount_test.go).
	image  *containerImage
	mounts []string // unmounted (detached) at cleanup
}

// newNode prepares a node and registers its cleanup: stop cube, then remove
// whatever is left (sandboxes, dataplane, cgroups, temp dir).
func newNode(t *testing.T) *node {
	t.Helper()
	needBins(t)
	dir, err := os.MkdirTemp("", "cit-")
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 3)
	rand.Read(raw)
	tag := hex.EncodeToString(raw)
	octet := proctest.FreeOctet(t, 20, 219, func(o int) []netip.Prefix {
		return []netip.Prefix{integrationTransit(o), integrationNodeCIDR(o)}
	})
	cfg := cubevs.DefaultConfig()
	cfg.RunDir = filepath.Join(dir, "run")
	cfg.HostVeth = "ci" + tag
	cfg.TablePrefix = "ci" + tag
	cfg.NodeCIDR, cfg.Transit = integrationNodeCIDR(octet), integrationTransit(octet)
	// Below the ephemeral range, so the API's free port never falls inside.
	cfg.PortMin = uint16(10000 + (octet%100)*100)
	cfg.PortMax = cfg.PortMin + 99
	n := &node{t: t, dir: dir, net: cfg, cgroup: "cube-it-" + tag, key: "key-" + tag, exe: bins.cube}
	n.httpClient = &http.Client{Transport: &http.Transport{DialContext: n.dial}}
	t.Cleanup(n.cleanup)
	return n
}

func (n *node) dataDir() string { return filepath.Join(n.dir, "data") }

// flags are the node-selecting flags shared by `cube up` and `cube node`.
func (n *node) flags() []string {
	envd := bins.envd
	if n.envdPath != "" {
		envd = n.envdPath
	}
	f := []string{
		"--data-dir", n.dataDir(), "--run-dir", n.net.RunDir, "--envd", envd,
		"--host-veth", n.net.HostVeth, "--table-prefix", n.net.TablePrefix,
		"--port-range", fmt.Sprintf("%d-%d", n.net.PortMin, n.net.PortMax),
		"--transit", n.net.Transit.String(), "--node-cidr", n.net.NodeCIDR.String(),
		"--cgroup-parent", n.cgroup,
	}
	if n.hostNetNS != "" {
		f = append(f, "--host-netns", n.hostNetNS)
	}
	return f
}

// start runs `cube up` and waits until it serves; it returns the time from
// process start to the first successful /health.
func (n *node) start() time.Duration {
	n.t.Helper()
	// A port found free can be taken by another test's socket before cube
	// binds it; try again on another port then.
	for attempt := 1; ; attempt++ {
		d, bindRace := n.startOnce(attempt < 3)
		if !bindRace {
			return d
		}
		n.t.Logf("listen port taken before cube bound it; retrying (attempt %d)", attempt)
	}
}

// startOnce starts cube up on a fresh port; with retryable set, a bind
// failure is reported as bindRace instead of failing the test.
func (n *node) startOnce(retryable bool) (_ time.Duration, bindRace bool) {
	n.t.Helper()
	port := n.freePort()
	n.listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// No warm pool: these tests plant orphans on the next IP the allocator
	// hands out, which a pool would already hold.
	// Slots of the pool's main template only (with n.extra's
	// --pool-size): the tests count supervisors and slots. No background
	// build of code-interpreter-v1 either: where the cache lacks it (a
	// fresh machine) its build sandbox would be one more sandbox, port
	// mapping and supervisor in every count (CI failed on that).
	args := append([]string{"up", "--listen", n.listen, "--api-key", n.key, "--log-level", "info", "--pool-size", "0", "--pool-templates=",
		"--prebuild-code-interpreter=false"}, n.flags()...)
	args = append(args, n.extra...)
	logf, err := os.OpenFile(filepath.Join(n.dir, "cube.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	fmt.Fprintf(logf, "---- %s %v\n", n.exe, args)
	cmd := exec.Command(n.exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the test binary dies, cube up dies with it (its sandboxes stay,
	// like after any agent crash).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if n.image != nil {
		n.image.wrap(cmd, n.exe)
	}
	n.startedAt = time.Now()
	exited, started := make(chan struct{}), make(chan error, 1)
	go func() {
		// Pdeathsig follows the forking thread: keep it alive, locked, for
		// the process's lifetime. It may have joined the Pod netns, so it is
		// never unlocked and ends with this goroutine.
		runtime.LockOSThread()
		defer close(exited)
		if err := setNS(n.podNS); err != nil {
			started <- err
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
	}()
	if err := <-started; err != nil {
		logf.Close()
		n.t.Fatalf("start cube up: %v", err)
	}
	n.proc, n.logf, n.exited = cmd, logf, exited
	return n.waitServing(n.startedAt, retryable)
}

// waitServing waits for /health; with retryable, a cube that exits because
// its port was taken reports bindRace instead of failing the test.
func (n *node) waitServing(since time.Time, retryable bool) (_ time.Duration, bindRace bool) {
	n.t.Helper()
	deadline := time.After(time.Minute)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.listen+"/health", nil)
		resp, err := n.httpClient.Do(req)
		cancel()
		last = err
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(since), false
			}
			last = fmt.Errorf("health: %s", resp.Status)
		}
		select {
		case <-n.exited:
			if retryable && strings.Contains(n.logTail(), "address already in use") {
				return 0, true
			}
			n.t.Fatalf("cube up exited before serving: %v\n%s", n.proc.ProcessState, n.logTail())
		case <-deadline:
			n.t.Fatalf("cube up not serving after 1m (%v)\n%s", last, n.logTail())
		case <-tick.C:
		}
	}
}

// kill SIGKILLs cube up (the agent crash) and waits for it to be gone.
func (n *node) kill() {
	n.t.Helper()
	n.signalAndWait(syscall.SIGKILL, 30*time.Second)
}

// stop asks cube up to stop (SIGTERM) and waits.
func (n *node) stop() {
	n.t.Helper()
	n.signalAndWait(syscall.SIGTERM, 90*time.Second)
}

func (n *node) signalAndWait(sig syscall.Signal, timeout time.Duration) {
	if n.proc == nil {
		return
	}
	n.proc.Process.Signal(sig)
	select {
	case <-n.exited:
	case <-time.After(timeout):
		n.proc.Process.Kill()
		<-n.exited
		n.t.Errorf("cube up did not exit within %s of %v", timeout, sig)
	}
	n.proc = nil
	n.logf.Close()
	n.httpClient.CloseIdleConnections()
}

func (n *node) logTail() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "cube.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// cubeCLI runs `cube <args>` with the node's flags appended; it returns the
// output and the exit code.
func (n *node) cubeCLI(args ...string) (string, int) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.exe, append(args, n.flags()...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	default:
		n.t.Fatalf("cube %v: %v", args, err)
		return "", -1
	}
}

// freePort finds a free loopback TCP port in the netns cube up will use,
// above every host-port range that tests DNAT on this host (10000-19999
// here, 20000-29999 a default Cube, 31000-40999 the cubelet tests): a
// listener inside such a range is shadowed by another node's DNAT.
func (n *node) freePort() int {
	var port int
	err := inNS(n.podNS, func() error {
		for range 100 {
			b := make([]byte, 2)
			rand.Read(b)
			p := 45000 + int(b[0])<<8%15000 + int(b[1])
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err == nil {
				port = p
				return l.Close()
			}
		}
		return errors.New("no free port in 45000-60000")
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return port
}

// dial connects from the netns cube up listens in.
func (n *node) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNS(n.podNS, func() error {
		var err error
		c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// cubeletConfig is the node as an in-process cubelet sees it (cleanup).
func (n *node) cubeletConfig() cubelet.Config {
	cfg := n.net
	cfg.HostNetNSPath = "" // the test runs in the host netns
	return cubelet.Config{
		StateDir: filepath.Join(n.dataDir(), "node"), Exe: bins.cube, EnvdPath: bins.envd, EnvdVersion: "it",
		CgroupParent: n.cgroup, Network: cfg,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// cleanup stops cube; if anything of the node survived (a failed test, a
// crashed process) an in-process cubelet kills the sandboxes and removes
// the dataplane; then the cgroup parents, pod netns pins and temp dir go.
func (n *node) cleanup() {
	t := n.t
	if n.proc != nil {
		n.stop()
	}
	if t.Failed() {
		t.Logf("cube log:\n%s", n.logTail())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, pinErr := os.Stat(n.net.DataplanePin())
	sbs, _ := os.ReadDir(filepath.Join(n.dataDir(), "node", "sandboxes"))
	if pinErr == nil || len(sbs) > 0 {
		c, err := cubelet.New(ctx, n.cubeletConfig(), template.NewRegistry(n.dataDir()))
		if err != nil {
			t.Errorf("cleanup: open node: %v", err)
		} else {
			if err := c.KillAll(ctx); err != nil {
				t.Errorf("cleanup: kill sandboxes: %v", err)
			}
			if err := c.DestroyNetwork(ctx); err != nil {
				t.Errorf("cleanup: destroy network: %v", err)
			}
			c.Close()
		}
	}
	for _, cg := range []string{n.cgroup, nsrt.ShimCgroup(n.cgroup)} {
		if err := cgroup.DeleteEverywhere(ctx, cg); err != nil {
			t.Errorf("cleanup: cgroup %s: %v", cg, err)
		}
	}
	for _, p := range []string{"pod-a", "pod-b"} {
		unpinNS(filepath.Join(n.dir, p))
	}
	for _, m := range n.mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmount %s: %v", m, err)
		}
	}
	if err := os.RemoveAll(n.dir); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// setNS moves the calling (locked) thread into the netns pinned at path.
func setNS(path string) error {
	if path == "" {
		return nil
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return netns.Set(ns)
}

// inNS runs fn on an OS thread in the netns pinned at path ("" = here).
// Processes started by fn inherit that netns. If the thread cannot return
// to its namespace it stays locked and is discarded.
func inNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// waitFor polls cond until it holds, failing t with cond's last detail after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v; last: %s", timeout, detail)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// integrationTransit and integrationNodeCIDR are the subnets of the test
// node at octet (proctest.FreeOctet picks one no host route covers).
func integrationTransit(octet int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("169.254.%d.8/30", octet))
}

func integrationNodeCIDR(octet int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("172.29.%d.0/24", octet))
}
