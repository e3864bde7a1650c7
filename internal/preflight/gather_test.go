package preflight

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestGatherRealHost gathers the facts of this machine (as root) and checks
// the ones the test can control or knows: a listener it opens in the port
// range shows up, a CNI config it writes is read, the server probe works.
func TestGatherRealHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (netlink, unshare)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	cni := t.TempDir()
	os.WriteFile(filepath.Join(cni, "10-flannel.conflist"), []byte(`{"plugins":[{"type":"flannel"}]}`), 0o644)
	os.WriteFile(filepath.Join(cni, "README"), []byte(`ignored`), 0o644)

	// The server is reached over a unix socket: loopback TCP ports may be
	// DNATed by dataplanes other tests leave on this machine.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
		}
	}))
	sock := filepath.Join(t.TempDir(), "server.sock")
	uln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = uln
	srv.Start()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	const serverURL = "http://cube-server:3000"

	f := Gather(context.Background(), GatherOptions{CNIConfDir: cni, ServerURL: serverURL, HTTPClient: client})
	if !slices.Contains(f.Filesystems, "overlay") || !f.NFTables.OK || !f.NetNS.OK || f.CgroupErr != "" {
		t.Fatalf("kernel facts: overlay=%v nft=%+v netns=%+v cgroup=%q", slices.Contains(f.Filesystems, "overlay"), f.NFTables, f.NetNS, f.CgroupErr)
	}
	for _, c := range requiredControllers {
		if !slices.Contains(f.CgroupControllers, c) {
			t.Errorf("controller %s missing from %v (%s)", c, f.CgroupControllers, f.CgroupVersion)
		}
	}
	if f.RoutesErr != "" || f.ListenersErr != "" || !slices.Contains(f.Links, "lo") {
		t.Fatalf("network facts: routes=%q listeners=%q links=%v", f.RoutesErr, f.ListenersErr, f.Links)
	}
	if f.Server.Status != 200 || f.Server.Err != "" {
		t.Fatalf("server probe = %+v", f.Server)
	}
	if len(f.CNIConfigs) != 1 || f.CNIConfigs[0].Types[0] != "flannel" {
		t.Fatalf("cni = %+v", f.CNIConfigs)
	}

	// The listener makes a range around its port fail; the CNI warns.
	cfg := DefaultConfig()
	cfg.PortMin, cfg.PortMax = port, port
	cfg.NodePortMin = 0
	cfg.ServerURL = serverURL
	rep := Check(cfg, f)
	if r := find(t, rep, "network.port-range"); r.Status != StatusFail {
		t.Fatalf("port-range = %+v, want fail for 127.0.0.1:%d", r, port)
	}
	if r := find(t, rep, "node.cni"); r.Status != StatusWarn {
		t.Fatalf("cni = %+v", r)
	}
	if r := find(t, rep, "server.reachable"); r.Status != StatusOK {
		t.Fatalf("server = %+v", r)
	}
	wantRuntime := "ns"
	if f.KVM {
		wantRuntime = "vm"
	}
	if rep.Runtime != wantRuntime {
		t.Fatalf("runtime = %s with kvm=%v", rep.Runtime, f.KVM)
	}

	// A closed server fails the probe.
	srv.Close()
	f = Gather(context.Background(), GatherOptions{CNIConfDir: cni, ServerURL: serverURL, HTTPClient: client})
	if f.Server.Err == "" {
		t.Fatalf("probe of a closed server = %+v", f.Server)
	}
}

func TestProbeKVMRefusesNonKVMDevices(t *testing.T) {
	if probeKVM("/dev/null") {
		t.Fatal("/dev/null taken for KVM")
	}
	if probeKVM(filepath.Join(t.TempDir(), "absent")) {
		t.Fatal("absent path taken for KVM")
	}
}
