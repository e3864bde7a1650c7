// Package cluster_test drives real `cube server` and `cube cubelet`
// processes on this machine: two nodes with their own dataplanes (distinct
// host veths, nft tables, port ranges, transit and sandbox subnets, cgroup
// parents), as several hosts would run them.
package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/proctest"
	"github.com/cube-dev/cube/internal/rootfstest"
)

// binDir holds cube, envd and the runtime binaries, built on first use by
// needBins.
var (
	binDir   string
	buildMu  sync.Mutex
	buildErr error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// needBins skips t unless it runs as root and builds the binaries on first
// use.
func needBins(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs cubelets, which create network namespaces, nftables tables and cgroups")
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if binDir == "" && buildErr == nil {
		dir, err := os.MkdirTemp("", "cube-cluster-bin-")
		if err == nil {
			if err = proctest.Build(dir); err == nil {
				binDir = dir
			} else {
				os.RemoveAll(dir)
			}
		}
		buildErr = err
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

func randHex(n int) string { return proctest.RandHex(n) }

func freePort(t *testing.T) int { return proctest.FreePort(t) }

// proc is a cube process started by the test.
type proc = proctest.Proc

func start(t *testing.T, log string, args ...string) *proc {
	t.Helper()
	return proctest.Start(t, filepath.Join(binDir, "cube"), log, args...)
}

// cluster is a server and its nodes.
type cluster struct {
	t      *testing.T
	dir    string
	url    string
	key    string
	server *proc
	// serverArgs start the server again (restartServer).
	serverArgs []string
	nodes      map[string]*nodeProc
}

type nodeProc struct {
	id     string
	listen string // the cubelet's node API listener, host:port
	args   []string
	net    cubevs.Config
	cg     string
	p      *proc
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	needBins(t)
	c := &cluster{t: t, dir: t.TempDir(), key: "cube_test_" + randHex(8), nodes: map[string]*nodeProc{}}
	port := freePort(t)
	c.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	c.serverArgs = []string{"server", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--data-dir", filepath.Join(c.dir, "server"), "--api-key", c.key, "--node-down-after", "2s"}
	c.restartServer()
	return c
}

// restartServer starts the server (again, after it was stopped) and waits
// for its health.
func (c *cluster) restartServer() {
	c.server = start(c.t, filepath.Join(c.dir, "server.log"), c.serverArgs...)
	c.waitFor("server health", 30*time.Second, func() bool {
		res, err := http.Get(c.url + "/health")
		if err == nil {
			res.Body.Close()
		}
		return err == nil && res.StatusCode == 200
	})
}

// addNode starts a cubelet with its own dataplane (subnets no other node
// uses: freeOctet) and a busybox template named "tiny".
func (c *cluster) addNode(id string) *nodeProc {
	octet := freeOctet(c.t)
	return c.addNodeAt(id, octet, uint16(30000+octet*20), 20)
}

// addNodePorts is addNode with ports host ports from portMin (a node takes
// a sandbox per host port).
func (c *cluster) addNodePorts(id string, portMin, ports uint16) *nodeProc {
	return c.addNodeAt(id, freeOctet(c.t), portMin, ports)
}

func (c *cluster) addNodeAt(id string, octet int, portMin, ports uint16) *nodeProc {
	t := c.t
	dir := filepath.Join(c.dir, id)
	tag := randHex(2)
	rootfs := busyboxRootfs(t)
	out, err := exec.Command(filepath.Join(binDir, "cube"), "template", "create", "tiny", "--from-dir", rootfs, "--data-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("template create: %v\n%s", err, out)
	}
	n := &nodeProc{id: id, cg: "cube-ct-" + tag}
	n.net = cubevs.DefaultConfig()
	n.net.RunDir = filepath.Join(dir, "run")
	n.net.DPName = "dp-" + tag
	n.net.HostVeth = "cc" + tag
	n.net.TablePrefix = "cc" + tag
	// Port ranges stay in 30000-32767: above the default range, below the
	// kernel's ephemeral ports (a DNATed range there would capture other
	// tests' outgoing connections).
	n.net.PortMin = portMin
	n.net.PortMax = n.net.PortMin + ports - 1
	n.net.Transit, n.net.NodeCIDR = nodeSubnets(octet)
	n.listen = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	n.args = []string{"cubelet", "--server", c.url, "--api-key", c.key, "--node-id", id,
		"--listen", n.listen, "--advertise-ip", "127.0.0.1",
		"--data-dir", dir, "--run-dir", n.net.RunDir, "--cgroup-parent", n.cg, "--build-base=false",
		"--host-veth", n.net.HostVeth, "--table-prefix", n.net.TablePrefix, "--dp-name", n.net.DPName,
		"--port-range", fmt.Sprintf("%d-%d", n.net.PortMin, n.net.PortMax), "--transit", n.net.Transit.String(),
		"--node-cidr", n.net.NodeCIDR.String(), "--envd", filepath.Join(binDir, "envd")}
	n.p = start(t, filepath.Join(c.dir, id+".log"), n.args...)
	c.nodes[id] = n
	t.Cleanup(func() { c.purgeNode(n) })
	c.waitState(id, "Ready", 30*time.Second)
	return n
}

// restartNode starts a node's cubelet again after it was stopped.
func (c *cluster) restartNode(n *nodeProc) {
	n.p = start(c.t, filepath.Join(c.dir, n.id+".log"), n.args...)
}

// purgeNode removes everything a node made: sandboxes (through its shims),
// the dataplane, cgroups.
func (c *cluster) purgeNode(n *nodeProc) {
	n.p.Kill(syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sbDir := filepath.Join(c.dir, n.id, "node", "sandboxes")
	ents, _ := os.ReadDir(sbDir)
	for _, e := range ents {
		nsrt.Cleanup(ctx, filepath.Join(sbDir, e.Name()), n.cg, e.Name())
	}
	if dp, err := cubevs.Open(ctx, n.net); err == nil {
		dp.Destroy(ctx)
	} else {
		c.t.Logf("purge %s dataplane: %v", n.id, err)
	}
	cgroup.DeleteEverywhere(ctx, n.cg)
	cgroup.DeleteEverywhere(ctx, nsrt.ShimCgroup(n.cg))
}

func (c *cluster) waitFor(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s\nserver log:\n%s", what, c.server.Tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type nodeStatus struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Sandboxes int    `json:"sandboxes"`
	Reason    string `json:"reason"`
	Drain     *struct {
		Phase string `json:"phase"`
	} `json:"drain"`
}

func (c *cluster) nodeStatus(id string) nodeStatus {
	var ns []nodeStatus
	c.call(http.MethodGet, "/nodes", nil, &ns, 200)
	for _, n := range ns {
		if n.ID == id {
			return n
		}
	}
	return nodeStatus{}
}

func (c *cluster) waitState(id, state string, d time.Duration) {
	c.waitFor("node "+id+" "+state, d, func() bool { return c.nodeStatus(id).State == state })
}

// call sends an authenticated JSON request and checks the status.
func (c *cluster) call(method, path string, body, out any, want int) {
	c.t.Helper()
	proctest.CallJSON(c.t, c.url, c.key, method, path, body, out, want)
}

func (c *cluster) create() string {
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	c.call(http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "tiny", "timeout": 600}, &sb, 201)
	return sb.SandboxID
}

// envdHealth asks the sandbox's envd for /health through the server proxy.
func (c *cluster) envdHealth(id string) int {
	req, _ := http.NewRequest(http.MethodGet, c.url+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}

func (c *cluster) cube(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(binDir, "cube"), args...)
	cmd.Env = append(os.Environ(), "CUBE_SERVER="+c.url, "CUBE_API_KEY="+c.key)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func busyboxRootfs(t *testing.T) string { return rootfstest.Busybox(t) }
