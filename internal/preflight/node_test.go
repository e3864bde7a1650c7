package preflight

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/cubevs"
)

// heldPorts opens a TCP listener and a connected UDP socket on loopback and
// returns their ports; both close with the test.
func heldPorts(t *testing.T) (tcp, udp uint16) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	peer, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	conn, err := net.Dial("udp4", peer.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return uint16(ln.Addr().(*net.TCPAddr).Port), uint16(conn.LocalAddr().(*net.UDPAddr).Port)
}

// TestNodePorts reads this process's own socket tables (any user can):
// a TCP listener and a connected UDP socket in the range are both named.
func TestNodePorts(t *testing.T) {
	tcp, udp := heldPorts(t)
	err := nodePorts(tcp, tcp)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("tcp/%d", tcp)) || !strings.Contains(err.Error(), "choose another --port-range") {
		t.Errorf("listener in range: %v", err)
	}
	if err := nodePorts(udp, udp); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("udp/%d", udp)) {
		t.Errorf("connected UDP socket in range: %v", err)
	}
	if err := nodePorts(1, 1); err != nil { // tcpmux: nobody listens there
		t.Errorf("empty range: %v", err)
	}
}

func TestNodeEnvd(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "envd"), filepath.Join(dir, "plain")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"":                            "no envd path configured",
		filepath.Join(dir, "missing"): "build it with `make build`",
		plain:                         "is not an executable file",
		dir:                           "is not an executable file",
		exe:                           "",
	} {
		err := nodeEnvd(path)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("nodeEnvd(%q) = %v, want %q", path, err, want)
		}
	}
}

func TestNodePinDir(t *testing.T) {
	nw := cubevs.DefaultConfig()
	nw.RunDir = t.TempDir()
	if err := nodePinDir(nw); err != nil {
		t.Errorf("before the first start: %v", err)
	}
	netnsDir := filepath.Join(nw.RunDir, "netns")
	if err := os.WriteFile(netnsDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := nodePinDir(nw); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("netns is a file: %v", err)
	}
	os.Remove(netnsDir)
	if err := os.Mkdir(netnsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := nodePinDir(nw); err != nil {
		t.Errorf("empty pin dir: %v", err)
	}
	// What a crash between creating the pin file and mounting on it leaves.
	if err := os.WriteFile(nw.DataplanePin(), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := nodePinDir(nw); err == nil || !strings.Contains(err.Error(), "is not a mounted netns") {
		t.Errorf("unmounted pin file: %v", err)
	}
}

func TestIsMountPoint(t *testing.T) {
	for path, want := range map[string]bool{"/proc": true, t.TempDir(): false, "/proc/self": false} {
		if got, err := isMountPoint(path); err != nil || got != want {
			t.Errorf("isMountPoint(%s) = %v, %v; want %v", path, got, err, want)
		}
	}
}

// TestCheckNodeRealHost runs every check on this machine for a node whose
// port range holds a listener of the test's: that check fails naming it,
// the ones the test controls pass, and all are reported in order.
func TestCheckNodeRealHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: nftables and netlink")
	}
	tcp, _ := heldPorts(t)
	envd := filepath.Join(t.TempDir(), "envd")
	if err := os.WriteFile(envd, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	nw := cubevs.DefaultConfig()
	nw.RunDir = t.TempDir()
	nw.PortMin, nw.PortMax = tcp, tcp
	checks := CheckNode(NodeSetup{Network: nw, EnvdPath: envd})
	var names []string
	got := map[string]NodeCheck{}
	for _, c := range checks {
		names = append(names, c.Name)
		got[c.Name] = c
	}
	if want := "nftables overlayfs cgroup-controllers ip-forward netns-pin-dir envd port-range routes"; strings.Join(names, " ") != want {
		t.Fatalf("checks %q, want %q", names, want)
	}
	for _, name := range []string{"nftables", "overlayfs", "cgroup-controllers", "netns-pin-dir", "envd"} {
		if !got[name].OK {
			t.Errorf("%s: %+v", name, got[name])
		}
	}
	if c := got["port-range"]; c.OK || !strings.Contains(c.Detail, fmt.Sprintf("tcp/%d", tcp)) {
		t.Errorf("port-range with our listener: %+v", c)
	}

	// A host netns that cannot be opened fails the checks made in it, with
	// the reason, and the others still run.
	nw.HostNetNSPath = filepath.Join(t.TempDir(), "missing")
	for _, c := range CheckNode(NodeSetup{Network: nw, EnvdPath: envd}) {
		inHost := c.Name == "nftables" || c.Name == "ip-forward" || c.Name == "port-range" || c.Name == "routes"
		if inHost && (c.OK || !strings.Contains(c.Detail, "no such file")) {
			t.Errorf("%s without a host netns: %+v", c.Name, c)
		}
		if !inHost && c.Name != "overlayfs" && !c.OK {
			t.Errorf("%s does not need the host netns, yet: %+v", c.Name, c)
		}
	}
}
