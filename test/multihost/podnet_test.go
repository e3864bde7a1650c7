package multihost_test

import (
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cubevs"
)

// TestPodNetworkNode runs a cubelet the way the chart does with
// cubeNode.hostNetwork=false: in a netns of its own (the Pod's, with an
// address only routed to, not owned by, the node), its dataplane in the
// node's netns (--host-netns). The server calls the cubelet's RPC at the Pod
// IP but must send sandbox traffic to the node's IP: the host ports are DNATed
// in the node's netns for the node's own addresses only. Registering the Pod
// IP as the data address (what the chart did before --data-ip) left every
// sandbox unreachable through the proxy.
func TestPodNetworkNode(t *testing.T) {
	tp := newTopo(t)
	c := newCluster(t, tp)
	srv := c.addServer("srv", 1)

	// The node "h1" and, behind it, its Pod "h1pod" on 10.78.N.0/30.
	const id = "h1"
	nodeIP := tp.addHost(id, 11)
	podNS := tp.ns(id + "pod")
	podNet := strings.Replace(tp.subnet, "10.77.", "10.78.", 1)
	gw, podIP := podNet+"1", podNet+"2"
	tp.run("ip", "netns", "add", podNS)
	tp.hosts = append(tp.hosts, podNS)
	tp.run("ip", "-n", podNS, "link", "set", "lo", "up")
	tp.run("ip", "-n", tp.ns(id), "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", podNS)
	tp.run("ip", "-n", tp.ns(id), "addr", "add", gw+"/30", "dev", "pod0")
	tp.run("ip", "-n", tp.ns(id), "link", "set", "pod0", "up")
	tp.run("ip", "-n", podNS, "addr", "add", podIP+"/30", "dev", "eth0")
	tp.run("ip", "-n", podNS, "link", "set", "eth0", "up")
	tp.run("ip", "-n", podNS, "route", "add", "default", "via", gw)
	tp.run("ip", "netns", "exec", tp.ns(id), "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// The "cluster network": the server reaches Pod IPs through their node.
	tp.run("ip", "-n", tp.ns(srv.name), "route", "add", podNet+"0/30", "via", nodeIP)

	n := &nodeProc{id: id, ip: podIP, dir: filepath.Join(c.dir, id), cg: "cube-mh" + tp.tag + "-" + id, bin: c.bin, c: c}
	n.net = cubevs.DefaultConfig()
	n.net.RunDir = filepath.Join(n.dir, "run")
	n.net.HostNetNSPath = tp.nsPath(id) // the dataplane lives in the node's netns
	if out, err := exec.Command(c.bin, "template", "create", "tiny", "--from-dir", busyboxRootfs(t), "--data-dir", n.dir).CombinedOutput(); err != nil {
		t.Fatalf("template create: %v\n%s", err, out)
	}
	n.args = []string{"cubelet", "--server", c.serverURLs(), "--node-id", id,
		"--listen", podIP + ":7070", "--advertise-ip", podIP, "--data-ip", nodeIP,
		"--host-netns", tp.nsPath(id),
		"--data-dir", n.dir, "--run-dir", n.net.RunDir,
		"--cgroup-parent", n.cg, "--build-base=false", "--envd", filepath.Join(binDir, "envd"),
		"--cpu-capacity", "64"}
	t.Cleanup(n.purge)
	n.p = startIn(t, "/run/netns/"+podNS, n.bin, filepath.Join(c.dir, id+".log"), n.args...)
	c.nodes[id] = n
	c.waitState(id, "Ready", readyTimeout)

	sb := c.mustCreate(60)
	if code := c.envdHealth(sb); code != http.StatusNoContent {
		t.Fatalf("envd /health of %s through the proxy (data IP %s): %d\n%s", sb, nodeIP, code, c.logs())
	}
	if code, body := c.call(http.MethodDelete, "/sandboxes/"+sb, nil, nil); code != http.StatusNoContent {
		t.Fatalf("kill %s: %d %s", sb, code, body)
	}
	c.waitFor("node to hold no sandbox", 30*time.Second, func() bool { return len(n.local()) == 0 })
}
