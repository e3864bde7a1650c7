package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/preflight"
)

func TestCubeletTargets(t *testing.T) {
	procs := []proc{
		{1, []string{"/sbin/init"}, "mnt:[1]"},
		{10, []string{"/usr/local/bin/cube", "cubelet", "--server", "x"}, "mnt:[7]"},
		{11, []string{"/usr/local/bin/cube", "shim", "--id", "sb1"}, "mnt:[7]"},
		{12, []string{"/usr/local/bin/cube", "cubelet"}, "mnt:[8]"}, // another container
		{13, []string{"/.cube/envd"}, "mnt:[9]"},
		{14, []string{"cube", "kube", "stop-cubelet"}, "mnt:[7]"},
		{15, []string{"python3", "cubelet"}, "mnt:[7]"},
		{16, []string{""}, "mnt:[7]"},
	}
	if got := cubeletTargets(procs, 14, "mnt:[7]"); !slices.Equal(got, []int{10}) {
		t.Fatalf("targets = %v, want [10]", got)
	}
	if got := cubeletTargets(procs, 14, "mnt:[99]"); len(got) != 0 {
		t.Fatalf("targets in a foreign container = %v", got)
	}
}

// TestStopCubeletSignalsOnlyCubelet runs a fake cubelet and a fake shim (a
// shell renamed via argv) in this mount namespace: stop-cubelet ends the
// first and leaves the second running.
func TestStopCubeletSignalsOnlyCubelet(t *testing.T) {
	// bash runs the script file named by argv[1] from its working
	// directory, so argv reads "cube cubelet" or "cube shim".
	dir := t.TempDir()
	start := func(role string) *exec.Cmd {
		os.WriteFile(filepath.Join(dir, role), []byte("trap 'exit 0' TERM\nsleep 30 & wait\n"), 0o644)
		c := &exec.Cmd{Path: "/bin/bash", Args: []string{"cube", role}, Dir: dir}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	cubelet, shim := start("cubelet"), start("shim")
	waited := make(chan struct{})
	go func() { cubelet.Wait(); close(waited) }()
	// Only this test's children are candidates: a real cubelet of another
	// test on this machine must never be signalled.
	mine := func() []proc {
		var out []proc
		for _, p := range listProcs("/proc") {
			if p.pid == cubelet.Process.Pid || p.pid == shim.Process.Pid {
				out = append(out, p)
			}
		}
		return out
	}
	self, _ := os.Readlink("/proc/self/ns/mnt")
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if pids = cubeletTargets(mine(), os.Getpid(), self); len(pids) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake cubelet never showed up in /proc: %+v", mine())
		}
	}
	if pids[0] != cubelet.Process.Pid {
		t.Fatalf("targets = %v, want the cubelet %d", pids, cubelet.Process.Pid)
	}
	var out bytes.Buffer
	if err := terminate(context.Background(), &out, "/proc", pids, 5*time.Second); err != nil {
		t.Fatalf("stop: %v (%s)", err, out.String())
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("cubelet still running")
	}
	if err := shim.Process.Signal(syscallZero); err != nil {
		t.Fatalf("shim was hit: %v", err)
	}
	if !strings.Contains(out.String(), "sent SIGTERM to cubelet pid") {
		t.Fatalf("output %q", out.String())
	}
}

func TestWaitPrep(t *testing.T) {
	dir := t.TempDir()
	genFile := filepath.Join(dir, "generation")
	os.WriteFile(genFile, []byte("4"), 0o644)
	envd := filepath.Join(dir, "artifacts", "envd")
	var out bytes.Buffer
	ctx := context.Background()
	if err := waitPrep(ctx, &out, genFile, dir, nil, 50*time.Millisecond, 10*time.Millisecond); err == nil {
		t.Fatal("no fingerprint, no error")
	}
	rep := preflight.Check(preflight.Config{NodeCIDR: preflight.DefaultConfig().NodeCIDR, PortMin: 1, PortMax: 1},
		preflight.Facts{Filesystems: []string{"overlay"}, NFTables: preflight.Probe{OK: true}, NetNS: preflight.Probe{OK: true},
			CgroupControllers: []string{"cpu", "memory", "pids"}})
	fp, err := preflight.NewFingerprint(4, "n", "v", "k", rep, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	preflight.WriteFingerprint(dir, fp)
	if err := waitPrep(ctx, &out, genFile, dir, []string{envd}, 50*time.Millisecond, 10*time.Millisecond); err == nil ||
		!strings.Contains(err.Error(), "cube-node-installer") {
		t.Fatalf("missing envd: %v", err)
	}
	os.MkdirAll(filepath.Dir(envd), 0o755)
	os.WriteFile(envd, []byte("x"), 0o755)
	if err := waitPrep(ctx, &out, genFile, dir, []string{envd}, time.Second, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// A new generation waits again.
	os.WriteFile(genFile, []byte("5"), 0o644)
	if err := waitPrep(ctx, &out, genFile, dir, nil, 50*time.Millisecond, 10*time.Millisecond); err == nil {
		t.Fatal("generation 5 has no fingerprint yet")
	}
}

func TestPreflightAndPrepCommands(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	ctx := context.Background()
	var out, errb bytes.Buffer
	// Port 1 is free here; a CIDR from the shared range avoids this host's routes.
	base := []string{"--port-range", "1-1", "--node-cidr", "100.127.252.0/24", "--cni-conf-dir", t.TempDir()}
	if code := Run(ctx, append([]string{"preflight", "--json"}, base...), &out, &errb); code != 0 {
		t.Fatalf("preflight exit %d: %s %s", code, out.String(), errb.String())
	}
	var rep preflight.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || !rep.Passed || len(rep.Results) == 0 {
		t.Fatalf("report %s: %v", out.String(), err)
	}
	out.Reset()
	if code := Run(ctx, append([]string{"preflight", "--runtime", "vm"}, base...), &out, &errb); code != 1 && !rep.Passed {
		t.Fatalf("forced vm exit %d", code)
	} else if code == 1 && !strings.Contains(out.String(), "fail") {
		t.Fatalf("failing report: %s", out.String())
	}
	if code := Run(ctx, []string{"preflight", "--node-cidr", "nope"}, &out, &errb); code != 2 {
		t.Fatalf("bad flag exit %d", code)
	}

	dir := filepath.Join(t.TempDir(), "prep")
	runDir := t.TempDir()
	args := append([]string{"prep", "--generation", "2", "--dir", dir, "--run-dir", runDir, "--node", "n1"}, base...)
	out.Reset()
	if code := Run(ctx, args, &out, &errb); code != 0 {
		t.Fatalf("prep exit %d: %s %s", code, out.String(), errb.String())
	}
	if fp, err := preflight.ReadFingerprint(dir, 2); err != nil || fp.Node != "n1" {
		t.Fatalf("fingerprint %+v, %v", fp, err)
	}
	// A failing preflight writes nothing.
	failing := append([]string{"prep", "--generation", "3", "--dir", dir, "--run-dir", runDir, "--service-cidr", "100.127.0.0/16"}, base...)
	if code := Run(ctx, failing, &out, &errb); code != 1 {
		t.Fatalf("failing prep exit %d", code)
	}
	if _, err := os.Stat(preflight.FingerprintPath(dir, 3)); !os.IsNotExist(err) {
		t.Fatalf("fingerprint written for a failed preflight: %v", err)
	}
	if code := Run(ctx, []string{"prep"}, &out, &errb); code != 2 {
		t.Fatalf("prep without generation exit %d", code)
	}
}

func TestKubeCommandErrors(t *testing.T) {
	ctx := context.Background()
	var out, errb bytes.Buffer
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if code := Run(ctx, []string{"kube", "hostnet-preflight", "--namespace", "x"}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "in-cluster config") {
		t.Fatalf("outside a cluster: exit %d %s", code, errb.String())
	}
	t.Setenv("POD_NAMESPACE", "")
	if code := Run(ctx, []string{"kube", "hostnet-preflight"}, &out, &errb); code != 2 {
		t.Fatalf("no namespace: exit %d", code)
	}
	if code := Run(ctx, []string{"kube", "nope"}, &out, &errb); code != 2 {
		t.Fatalf("unknown: exit %d", code)
	}
	src, dst := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "envd"), []byte("e"), 0o755)
	out.Reset()
	if code := Run(ctx, []string{"kube", "install-artifacts", "--from", src, "--to", dst}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "installed 1 artifacts") {
		t.Fatalf("install: exit %d %s %s", code, out.String(), errb.String())
	}
}

// syscallZero is signal 0: "does the process exist".
var syscallZero = syscall.Signal(0)
