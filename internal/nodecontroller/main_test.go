package nodecontroller_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/proctest"
	"github.com/cube-dev/cube/internal/rootfstest"
)

// binDir holds cube and envd built by TestMain; skipReason says why the
// envtest suite cannot run here (then binDir is empty).
var binDir, skipReason string

// TestMain builds cube and envd for the envtest suite when it can run (root,
// KUBEBUILDER_ASSETS); the pure tests run either way.
func TestMain(m *testing.M) {
	switch assets := os.Getenv("KUBEBUILDER_ASSETS"); {
	case os.Geteuid() != 0:
		skipReason = "needs root (a real cubelet makes namespaces, nft tables, cgroups)"
	case assets == "":
		skipReason = "KUBEBUILDER_ASSETS is not set: run KUBEBUILDER_ASSETS=\"$(bash hack/kube-test-assets.sh)\" go test ./internal/nodecontroller/ (or make unit)"
	default:
		for _, b := range []string{"kube-apiserver", "etcd"} {
			if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
				skipReason = fmt.Sprintf("KUBEBUILDER_ASSETS=%s has no %s: run bash hack/kube-test-assets.sh", assets, b)
			}
		}
	}
	code := 0
	if skipReason == "" {
		dir, err := os.MkdirTemp("", "cube-nodecontroller-bin-")
		if err != nil {
			panic(err)
		}
		binDir = dir
		if err := proctest.Build(dir); err != nil {
			fmt.Println(err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
		code = m.Run()
		os.RemoveAll(dir)
	} else {
		code = m.Run()
	}
	os.Exit(code)
}

// requireSuite skips the envtest suite where it cannot run, and fails it
// instead under CI=true so a CI machine without assets is noticed.
func requireSuite(t *testing.T) {
	t.Helper()
	if skipReason == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("node controller envtest suite cannot run: %s", skipReason)
	}
	t.Skip(skipReason)
}

func randHex(n int) string { return proctest.RandHex(n) }

func freePort(t *testing.T) int { return proctest.FreePort(t) }

// proc is a cube process started by the test; killed at cleanup.
type proc = proctest.Proc

func start(t *testing.T, log string, args ...string) *proc {
	t.Helper()
	return proctest.Start(t, filepath.Join(binDir, "cube"), log, args...)
}

// cubeEnv is a real `cube server` with one real cubelet: its own
// dataplane names, port range, transit and sandbox subnets, and a busybox
// template "tiny".
type cubeEnv struct {
	t       *testing.T
	dir     string
	url     string
	key     string
	server  *proc
	nodeID  string
	cubelet *proc
}

func newCubeEnv(t *testing.T, nodeID string) *cubeEnv {
	t.Helper()
	c := &cubeEnv{t: t, dir: t.TempDir(), key: "cube_test_" + randHex(8), nodeID: nodeID}
	port := freePort(t)
	c.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	c.server = start(t, filepath.Join(c.dir, "server.log"), "server", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--data-dir", filepath.Join(c.dir, "server"), "--api-key", c.key, "--node-down-after", "5s")
	c.waitFor("server health", 30*time.Second, func() bool {
		res, err := http.Get(c.url + "/health")
		if err == nil {
			res.Body.Close()
		}
		return err == nil && res.StatusCode == 200
	})

	dir := filepath.Join(c.dir, nodeID)
	out, err := exec.Command(filepath.Join(binDir, "cube"), "template", "create", "tiny", "--from-dir", rootfstest.Busybox(t), "--data-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("template create: %v\n%s", err, out)
	}
	r, _ := rand.Int(rand.Reader, big.NewInt(70))
	octet := int(r.Int64())
	tag := randHex(2)
	cg := "cube-nc-" + tag
	dp := cubevs.DefaultConfig()
	dp.RunDir = filepath.Join(dir, "run")
	dp.DPName, dp.HostVeth, dp.TablePrefix = "dq-"+tag, "cq"+tag, "cq"+tag
	// Below the kernel's ephemeral ports; away from test/cluster's ranges.
	dp.PortMin = uint16(32000 + octet*10)
	dp.PortMax = dp.PortMin + 9
	dp.Transit = netip.MustParsePrefix(fmt.Sprintf("10.252.%d.0/30", octet))
	dp.NodeCIDR = netip.MustParsePrefix(fmt.Sprintf("172.30.%d.0/24", octet))
	c.cubelet = start(t, filepath.Join(c.dir, nodeID+".log"), "cubelet", "--server", c.url, "--api-key", c.key,
		"--node-id", nodeID, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--advertise-ip", "127.0.0.1",
		"--data-dir", dir, "--run-dir", dp.RunDir, "--cgroup-parent", cg, "--build-base=false",
		"--host-veth", dp.HostVeth, "--table-prefix", dp.TablePrefix, "--dp-name", dp.DPName,
		"--port-range", fmt.Sprintf("%d-%d", dp.PortMin, dp.PortMax), "--transit", dp.Transit.String(),
		"--node-cidr", dp.NodeCIDR.String(), "--envd", filepath.Join(binDir, "envd"))
	t.Cleanup(func() { purge(t, c.cubelet, dir, cg, dp) })
	c.waitState("Ready", 30*time.Second)
	return c
}

// purge removes what the cubelet made: sandboxes, dataplane, cgroups.
func purge(t *testing.T, p *proc, dir, cg string, dp cubevs.Config) {
	p.Kill(syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sbDir := filepath.Join(dir, "node", "sandboxes")
	ents, _ := os.ReadDir(sbDir)
	for _, e := range ents {
		nsrt.Cleanup(ctx, filepath.Join(sbDir, e.Name()), cg, e.Name())
	}
	if d, err := cubevs.Open(ctx, dp); err == nil {
		d.Destroy(ctx)
	} else {
		t.Logf("purge dataplane: %v", err)
	}
	cgroup.DeleteEverywhere(ctx, cg)
	cgroup.DeleteEverywhere(ctx, nsrt.ShimCgroup(cg))
}

func (c *cubeEnv) waitFor(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s\nserver log:\n%s", what, c.server.Tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cubeNode is the node as GET /nodes lists it (nil: not listed).
type cubeNode struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Sandboxes int    `json:"sandboxes"`
	Drain     *struct {
		Policy string `json:"policy"`
		Phase  string `json:"phase"`
	} `json:"drain"`
}

func (c *cubeEnv) node() *cubeNode {
	var ns []cubeNode
	c.call(http.MethodGet, "/nodes", nil, &ns, 200)
	for _, n := range ns {
		if n.ID == c.nodeID {
			return &n
		}
	}
	return nil
}

func (c *cubeEnv) waitState(state string, d time.Duration) {
	c.t.Helper()
	c.waitFor("cube node "+c.nodeID+" "+state, d, func() bool {
		n := c.node()
		return n != nil && n.State == state
	})
}

// deleted reports whether the server logged the node's deletion with force.
func (c *cubeEnv) deleted(force bool) bool {
	for _, l := range strings.Split(c.server.Read(), "\n") {
		if strings.Contains(l, `msg="node deleted"`) && strings.Contains(l, "node="+c.nodeID+" ") &&
			strings.Contains(l, fmt.Sprintf("force=%v", force)) {
			return true
		}
	}
	return false
}

func (c *cubeEnv) call(method, path string, body, out any, want int) {
	c.t.Helper()
	proctest.CallJSON(c.t, c.url, c.key, method, path, body, out, want)
}

// createSandbox starts a sandbox from "tiny" (on the only node).
func (c *cubeEnv) createSandbox() string {
	c.t.Helper()
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	c.call(http.MethodPost, "/v2/sandboxes", map[string]any{"templateID": "tiny", "timeout": 600}, &sb, 201)
	return sb.SandboxID
}
