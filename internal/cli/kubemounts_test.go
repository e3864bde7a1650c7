package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/preflight"
)

// TestMain lets the test binary stand in for the cube binary: with
// CUBE_CLI_TEST_MAIN=1 it runs the command line as `cube` would (the
// chart's init container re-runs itself through nsenter that way), with
// CUBE_CLI_TEST_NETWORK_FLAGS=1 it parses the cubelet's network flags only
// (TestHostNetNSAuto runs it in a throwaway netns). Tests that need root
// skip themselves; the rest run as any user.
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("CUBE_CLI_TEST_MAIN") == "1":
		os.Exit(Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	case os.Getenv("CUBE_CLI_TEST_NETWORK_FLAGS") == "1":
		os.Exit(networkFlagsMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// networkFlagsMain parses the network flags of a cubelet and prints the
// host netns path they resolve to; it returns the exit code.
func networkFlagsMain(args []string) int {
	cfg := cubevs.DefaultConfig()
	fs := pflag.NewFlagSet("cubelet", pflag.ContinueOnError)
	addNetworkFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if _, err := resolveHostNetNS(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(cfg.HostNetNSPath)
	return 0
}

// TestShareMountsFromAContainerMountNS runs `cube kube share-mounts` the
// way cube-node's init container does: in its own mount namespace (here a
// throwaway one made by unshare, whose parent, this test, plays the runtime
// shim on the host). It must bind the directory onto itself shared in the
// HOST's mount namespace (this test's), not its own, and a rerun must not
// stack a second bind.
func TestShareMountsFromAContainerMountNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount namespaces)")
	}
	dir := filepath.Join(t.TempDir(), "run-cube")
	t.Cleanup(func() {
		for range 3 { // whatever a failed run stacked
			_ = exec.Command("umount", dir).Run()
		}
	})
	count := func() (n int, shared bool) {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range preflight.ParseMountInfo(string(b)) {
			if m.Point == dir {
				n, shared = n+1, m.Shared
			}
		}
		return n, shared
	}
	for i, want := range []string{preflight.SharedBound, preflight.SharedAlready} {
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", os.Args[0], "kube", "share-mounts", "--dir="+dir)
		cmd.Env = append(os.Environ(), "CUBE_CLI_TEST_MAIN=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out.String())
		}
		if !strings.Contains(out.String(), "host mount namespace: /proc/") || !strings.Contains(out.String(), dir+": "+want) {
			t.Errorf("run %d: output %q, want the host namespace found and %q", i, out.String(), want)
		}
		if n, shared := count(); n != 1 || !shared {
			t.Fatalf("run %d: %d mounts at %s in the host namespace (shared %t), want 1 shared", i, n, dir, shared)
		}
	}
}

// TestShareMountsRefusesWithoutAHostNS: run in the host's own mount
// namespace without --here (no hostPID container around it), it finds no
// other namespace and says what to do instead of binding anything.
func TestShareMountsRefusesWithoutAHostNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (other processes' namespaces)")
	}
	dir := filepath.Join(t.TempDir(), "d")
	var out, errOut bytes.Buffer
	code := Run(context.Background(), []string{"kube", "share-mounts", "--dir=" + dir}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "hostPID: true") {
		t.Errorf("exit %d, stderr %q; want a failure naming hostPID", code, errOut.String())
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("%s was created although nothing was done", dir)
	}
}

// TestHostNetNSAuto: `--host-netns=auto` in a process on its own netns (a
// cubelet on the Pod network; here a throwaway netns whose parent, this
// test, plays the runtime shim) resolves to a path that opens the host's
// netns, this test's. In the host netns itself it fails saying why, so
// the chart's cubelet exits with that message instead of looping on
// "open host netns: permission denied".
func TestHostNetNSAuto(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	cmd := exec.Command("unshare", "--net", os.Args[0], "--host-netns=auto")
	cmd.Env = append(os.Environ(), "CUBE_CLI_TEST_NETWORK_FLAGS=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("in a throwaway netns: %v\n%s", err, stderr.String())
	}
	path := strings.TrimSpace(string(out))
	got, err1 := os.Readlink(path)
	want, err2 := os.Readlink("/proc/self/ns/net")
	if err1 != nil || err2 != nil || got != want || !strings.HasPrefix(path, "/proc/") {
		t.Errorf("--host-netns=auto = %q (%s, %v), want a /proc path of the host netns %s (%v)", path, got, err1, want, err2)
	}

	cmd = exec.Command(os.Args[0], "--host-netns=auto")
	cmd.Env = append(os.Environ(), "CUBE_CLI_TEST_NETWORK_FLAGS=1")
	msg, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(msg), "--host-netns=auto") || !strings.Contains(string(msg), "hostNetwork: true") {
		t.Errorf("in the host netns: %v %q; want a failure that names the flag and hostNetwork", err, msg)
	}
	// A path is taken as given.
	cmd = exec.Command(os.Args[0], "--host-netns=/proc/self/ns/net")
	cmd.Env = append(os.Environ(), "CUBE_CLI_TEST_NETWORK_FLAGS=1")
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "/proc/self/ns/net" {
		t.Errorf("explicit path: %q %v", out, err)
	}
}
