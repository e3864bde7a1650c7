package multihost_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	mrand "math/rand/v2"
)

// topo is the test's network: a "switch" netns holding a bridge, one netns
// per simulated host joined to the bridge by a veth, and a veth from the
// test's own netns to the bridge so the test reaches the hosts at their
// addresses. The subnet is 10.77.N.0/24 with N picked at random among the
// ones no route of this netns touches (parallel runs do not collide).
type topo struct {
	t      *testing.T
	tag    string
	subnet string // "10.77.N."
	hostIP string // the test's address on the bridge
	sw     string // switch netns
	link   string // the test's end of its veth
	hosts  []string
}

func newTopo(t *testing.T) *topo {
	t.Helper()
	needBins(t)
	out, err := exec.Command("ip", "-o", "-4", "route", "show", "table", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("ip route: %v %s", err, out)
	}
	n := -1
	for _, i := range mrand.Perm(250) {
		if !strings.Contains(string(out), fmt.Sprintf("10.77.%d.", i+1)) && !strings.Contains(string(out), "10.77.0.0/16") {
			n = i + 1
			break
		}
	}
	if n < 0 {
		t.Fatal("no free 10.77.N.0/24 subnet")
	}
	tag := randHex(2)
	tp := &topo{t: t, tag: tag, subnet: fmt.Sprintf("10.77.%d.", n), sw: "mh" + tag + "-sw", link: "mh" + tag + "h"}
	tp.hostIP = tp.subnet + "254"
	t.Cleanup(tp.destroy)
	tp.run("ip", "netns", "add", tp.sw)
	tp.run("ip", "-n", tp.sw, "link", "set", "lo", "up")
	tp.run("ip", "-n", tp.sw, "link", "add", "br0", "type", "bridge")
	tp.run("ip", "-n", tp.sw, "link", "set", "br0", "up")
	tp.run("ip", "link", "add", tp.link, "type", "veth", "peer", "name", "host", "netns", tp.sw)
	tp.run("ip", "-n", tp.sw, "link", "set", "host", "master", "br0", "up")
	tp.run("ip", "addr", "add", tp.hostIP+"/24", "dev", tp.link)
	tp.run("ip", "link", "set", tp.link, "up")
	return tp
}

// addHost makes the netns of a simulated host with address 10.77.N.octet.
func (tp *topo) addHost(name string, octet int) string {
	ns := tp.ns(name)
	ip := fmt.Sprintf("%s%d", tp.subnet, octet)
	tp.run("ip", "netns", "add", ns)
	tp.hosts = append(tp.hosts, ns)
	tp.run("ip", "-n", ns, "link", "set", "lo", "up")
	tp.run("ip", "-n", tp.sw, "link", "add", "v-"+name, "type", "veth", "peer", "name", "eth0", "netns", ns)
	tp.run("ip", "-n", tp.sw, "link", "set", "v-"+name, "master", "br0", "up")
	tp.run("ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
	tp.run("ip", "-n", ns, "link", "set", "eth0", "up")
	return ip
}

func (tp *topo) ns(name string) string     { return "mh" + tp.tag + "-" + name }
func (tp *topo) nsPath(name string) string { return "/run/netns/" + tp.ns(name) }

func (tp *topo) run(args ...string) {
	tp.t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		tp.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// destroy removes the hosts' netns (with every link in them), the switch
// and the test's veth. Processes must be gone by then (they are stopped by
// cleanups registered later, which run first).
func (tp *topo) destroy() {
	for _, ns := range append(tp.hosts, tp.sw) {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			tp.t.Logf("ip netns del %s: %v %s", ns, err, out)
		}
	}
	if _, err := os.Stat("/sys/class/net/" + tp.link); err == nil {
		exec.Command("ip", "link", "del", tp.link).Run()
	}
}
