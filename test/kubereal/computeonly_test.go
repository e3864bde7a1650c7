package kubereal

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// testComputeOnly installs the chart as a compute-only release (two-cluster
// mode, docs/kubernetes/install.md) pointed at a `cube server` running on
// the host, with cubeNode.buildBaseTemplate=false on a node whose template
// store is empty: the first create makes the node fetch `base` from that
// server (GET /cube/v1/templates/base, digest checked) instead of
// debootstrapping it. It runs on the node testUninstall cleaned, before the
// release is re-installed: the only moment the node has no sandbox whose
// overlay sits on its templates.
func testComputeOnly(t *testing.T) {
	ctx := testCtx(t)
	n, err := kubeNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ip := nodeInternalIP(n)
	if ip == "" {
		t.Fatalf("Node %s has no InternalIP", n.Name)
	}

	// The management side: a server on the host that holds `base` (as
	// `cube template create` registers it; here from the node's own copy).
	dir := t.TempDir()
	srvData := filepath.Join(dir, "server")
	must(t, 5*time.Minute, env.CubeBin, "template", "create", "base", "--data-dir", srvData,
		"--from-dir", filepath.Join(nodeTemplatesDir, "base", "rootfs"))
	if err := os.RemoveAll(nodeTemplatesDir); err != nil {
		t.Fatalf("remove the node's templates: %v", err)
	}
	url := startHostServer(t, srvData, net.JoinHostPort(ip, freePort(t, ip)))

	// The compute side: the chart without its control plane, with the key
	// the bundled release left in cube-api-key (the host server accepts it).
	restore := useServer(url)
	defer restore()
	args := []string{"install", env.Release, env.Chart, "-n", env.Namespace, "-f", env.Values, "--wait", "--timeout", "10m",
		"--set", "controlPlane.enabled=false", "--set", "externalControlPlane.serverEndpoint=" + url,
		"--set", "cubeNode.buildBaseTemplate=false"}
	out := must(t, 15*time.Minute, "helm", args...)
	t.Logf("helm install (compute-only, server %s):\n%s", url, tail(out, 8))
	defer uninstallComputeOnly(t)
	pod := readyNodePod(t, 5*time.Minute)
	waitCubeNodeState(t, "Ready", 3*time.Minute)
	mustCreateOne(t, "compute-only node without templates, base from the host server")

	logs := mustKubectl(t, "logs", pod.Name, "-c", "cubelet")
	if !regexp.MustCompile(`msg="template fetched" .*template=base `).MatchString(logs) {
		t.Errorf("cubelet log of %s has no fetch of base from the server:\n%s", pod.Name, tail(logs, 40))
	}
	if _, err := os.Stat(filepath.Join(nodeTemplatesDir, "base", "template.json")); err != nil {
		t.Errorf("base is not in the node's template store after the fetch: %v", err)
	}
}

// nodeTemplatesDir is the cube-node's template store on this host.
const nodeTemplatesDir = "/var/lib/cube/templates"

func nodeInternalIP(n corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func freePort(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// startHostServer runs `cube server` (SQLite in dataDir, the suite's API
// key) on addr until the test ends and returns its URL once it answers.
func startHostServer(t *testing.T, dataDir, addr string) string {
	t.Helper()
	logFile, err := os.Create(filepath.Join(filepath.Dir(dataDir), "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(env.CubeBin, "server", "--listen", addr, "--data-dir", dataDir, "--api-key", env.APIKey, "--require-node-key")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start cube server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("host cube server log:\n%s", tail(string(b), 60))
		}
	})
	url := "http://" + addr
	waitFor(t, "the host cube server to answer", time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		out, err := run(ctx, 10*time.Second, env.CubeBin, "node", "ls", "--server", url, "--api-key", env.APIKey)
		if err != nil {
			return false, err.Error()
		}
		return true, out
	})
	return url
}

// useServer points the suite (SDK, cube node ls) at url until the returned
// func puts the previous server back.
func useServer(url string) func() {
	prev := env.APIURL
	set := func(u string) {
		env.APIURL = u
		os.Setenv("E2B_API_URL", u)
		os.Setenv("E2B_SANDBOX_URL", u)
	}
	set(url)
	return func() { set(prev) }
}

// uninstallComputeOnly removes the compute-only release and what its node
// left (the node keeps the fetched base: the bundled re-install uses it).
func uninstallComputeOnly(t *testing.T) {
	t.Helper()
	flags := nodeFlags(t)
	if out, err := run(testCtx(t), 10*time.Minute, "helm", "uninstall", env.Release, "-n", env.Namespace, "--wait", "--timeout", "5m"); err != nil {
		t.Errorf("helm uninstall of the compute-only release: %v\n%s", err, tail(out, 20))
	}
	waitFor(t, "every cube-node Pod to be gone", 3*time.Minute, time.Second, func(ctx context.Context) (bool, string) {
		pods, err := nodePods(ctx)
		if err != nil {
			return false, err.Error()
		}
		return len(pods) == 0, describePods(pods)
	})
	mustKubectl(t, "delete", "job", "cube-node-hostnet-preflight", "--ignore-not-found")
	mustKubectl(t, "delete", "job,serviceaccount,role,rolebinding", "cube-node-release", "--ignore-not-found")
	must(t, cmdTimeout, "kubectl", "delete", "clusterrole,clusterrolebinding", env.Namespace+"-cube-node-release", "--ignore-not-found")
	out := must(t, 5*time.Minute, env.CubeBin, append([]string{"node", "cleanup", "--purge-state"}, flags...)...)
	t.Logf("cube node cleanup --purge-state after the compute-only release:\n%s", tail(out, 10))
}
