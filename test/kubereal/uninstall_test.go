package kubereal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// testUninstall follows docs/kubernetes/uninstall.md with sandboxes
// running: helm uninstall (its pre-delete hook releases the Node), the
// documented Job cleanup, `cube node cleanup --purge-state` on the node,
// then the doc's checks: no Cube link, nft table, mount, cgroup or process
// on the host. It re-installs the release with the values file afterwards,
// so the cluster is usable again (and re-installing after a cleanup is
// itself checked: the node comes back Ready and creates work).
func testUninstall(t *testing.T) {
	var own []string
	if err := sdk(testCtx(t), 5*time.Minute, &own, "create-counters", "2"); err != nil {
		t.Fatalf("create sandboxes for the uninstall: %v", err)
	}
	flags := nodeFlags(t) // from the release's values, before it is gone
	parent := flagValue(flags, "--cgroup-parent")
	t.Cleanup(func() { reinstall(t) })
	dropFleet(t)

	out := must(t, 10*time.Minute, "helm", "uninstall", env.Release, "-n", env.Namespace, "--wait", "--timeout", "5m")
	t.Logf("helm uninstall:\n%s", tail(out, 20))
	waitFor(t, "every cube-node Pod to be gone", 3*time.Minute, time.Second, func(ctx context.Context) (bool, string) {
		pods, err := nodePods(ctx)
		if err != nil {
			return false, err.Error()
		}
		return len(pods) == 0, describePods(pods)
	})
	n, err := kubeNode(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(n.Finalizers, "cube.dev/node-controller") {
		t.Errorf("Node %s still has the finalizer cube.dev/node-controller after helm uninstall", n.Name)
	}
	if _, ok := n.Annotations["cube.dev/drain-status"]; ok {
		t.Errorf("Node %s still has the annotation cube.dev/drain-status", n.Name)
	}
	for _, c := range []string{"CubeDrain", "CubeSchedulable"} {
		if _, ok := nodeCondition(n, c); ok {
			t.Errorf("Node %s still has the condition %s", n.Name, c)
		}
	}
	// Step 3's Job cleanup (the kept Secrets stay: the re-install reuses the
	// API key the env file carries).
	mustKubectl(t, "delete", "job", "cube-node-hostnet-preflight", "cube-test-server-health", "cube-test-node-registration", "--ignore-not-found")
	mustKubectl(t, "delete", "job,serviceaccount,role,rolebinding", "cube-node-release", "--ignore-not-found")
	must(t, cmdTimeout, "kubectl", "delete", "clusterrole,clusterrolebinding", env.Namespace+"-cube-node-release", "--ignore-not-found")
	// The Jobs' Pods go with the garbage collector, shortly after.
	waitFor(t, "no object of the release left (but the kept Secrets)", time.Minute, 2*time.Second, func(ctx context.Context) (bool, string) {
		left, err := kubectl(ctx, "get", "all,cm,sa,role,rolebinding", "-l", "app.kubernetes.io/instance="+env.Release, "-o", "name")
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(left) == "", left
	})

	// Step 4: clean the node (this machine).
	out = must(t, 5*time.Minute, env.CubeBin, append([]string{"node", "cleanup", "--purge-state"}, flags...)...)
	t.Logf("cube node cleanup --purge-state:\n%s", tail(out, 30))
	m := regexp.MustCompile(`(\d+) sandboxes killed`).FindStringSubmatch(out)
	if m == nil {
		t.Errorf("cube node cleanup did not report the sandboxes it killed")
	} else if k, _ := strconv.Atoi(m[1]); k < len(own) {
		t.Errorf("cube node cleanup reported %d sandboxes killed; %d were running", k, len(own))
	}

	// Step 5: verify.
	for _, leak := range hostLeftovers(parent) {
		t.Errorf("left on the host after uninstall and cleanup: %s", leak)
	}

	// The cleaned node, with no sandbox on its templates, is where a
	// compute-only release that fetches `base` can start from nothing.
	if !t.Failed() {
		t.Run("ComputeOnly", testComputeOnly)
	}
}

func flagValue(flags []string, name string) string {
	for i, f := range flags {
		if f == name && i+1 < len(flags) {
			return flags[i+1]
		}
	}
	return ""
}

// hostLeftovers lists what Cube's default node names still hold on the
// host: the host veth and nft table, mounts and netns pins under /run/cube
// and /var/lib/cube, the cgroup parents and processes in them or running
// from the node's directories, and the node state dir.
func hostLeftovers(parent string) []string {
	var out []string
	if links, err := run(context.Background(), cmdTimeout, "ip", "-o", "link", "show"); err == nil {
		for _, l := range strings.Split(links, "\n") {
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(strings.TrimSuffix(f[1], ":"), "cube") {
				out = append(out, "link "+strings.TrimSuffix(f[1], ":"))
			}
		}
	}
	if tables, err := run(context.Background(), cmdTimeout, "nft", "list", "tables"); err == nil {
		for _, l := range strings.Split(tables, "\n") {
			if f := strings.Fields(l); len(f) == 3 && strings.HasPrefix(f[2], "cube") {
				out = append(out, "nft "+l)
			}
		}
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(mi), "\n") {
			f := strings.Fields(l)
			if len(f) < 5 {
				continue
			}
			for _, d := range []string{"/run/cube", "/var/lib/cube"} {
				if f[4] == d || strings.HasPrefix(f[4], d+"/") {
					out = append(out, "mount "+f[4])
				}
			}
		}
	}
	for _, p := range []string{"/run/cube/netns", "/var/lib/cube/node"} {
		if _, err := os.Stat(p); err == nil {
			out = append(out, "path "+p)
		}
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
	more, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent + "-shims")
	for _, d := range append(dirs, more...) {
		out = append(out, "cgroup "+d)
	}
	for _, d := range []string{"/sys/fs/cgroup/" + parent, "/sys/fs/cgroup/" + parent + "-shims"} {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, "cgroup "+d)
		}
	}
	out = append(out, cubeProcesses(parent)...)
	return out
}

// cubeProcesses are processes in the node's cgroup parents (shims,
// supervisors, sandbox processes) or started from its directories.
func cubeProcesses(parent string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	cg := regexp.MustCompile(`:/` + regexp.QuoteMeta(parent) + `(-shims)?(/|$)`)
	for _, p := range procs {
		pid := filepath.Base(p)
		if pid == strconv.Itoa(os.Getpid()) {
			continue
		}
		cgroups, err := os.ReadFile(p + "/cgroup")
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(p + "/cmdline")
		args := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
		inCg := false
		for _, l := range strings.Split(string(cgroups), "\n") {
			if cg.MatchString(l) {
				inCg = true
			}
		}
		if inCg || strings.Contains(args, "/var/lib/cube/") || strings.Contains(args, "/run/cube/") {
			out = append(out, fmt.Sprintf("process %s: %s", pid, args))
		}
	}
	return out
}

// reinstall puts the release back as kube-up installed it and waits until
// the node serves.
func reinstall(t *testing.T) {
	if _, err := run(testCtx(t), cmdTimeout, "helm", "status", env.Release, "-n", env.Namespace); err == nil {
		return
	}
	must(t, 20*time.Minute, "helm", "install", env.Release, env.Chart, "-n", env.Namespace, "-f", env.Values, "--wait", "--timeout", "15m")
	// The Service's ClusterIP is assigned at install: the env file's URL
	// is stale now (docs/kubernetes/local-cluster.md says to read it again).
	ip := strings.TrimSpace(mustKubectl(t, "get", "service", "cube-server", "-o", "jsonpath={.spec.clusterIP}:{.spec.ports[0].port}"))
	if url := "http://" + ip; url != env.APIURL {
		// Keep the env file true for whoever uses the cluster next (a
		// second run of this suite included).
		file := filepath.Join(env.Dir, "env")
		if b, err := os.ReadFile(file); err != nil {
			t.Errorf("update %s: %v", file, err)
		} else if err := os.WriteFile(file, []byte(strings.ReplaceAll(string(b), env.APIURL, url)), 0o644); err != nil {
			t.Errorf("update %s: %v", file, err)
		}
		t.Logf("cube-server's ClusterIP changed with the re-install: %s -> %s (updated in %s)", env.APIURL, url, file)
		env.APIURL = url
		os.Setenv("E2B_API_URL", url)
		os.Setenv("E2B_SANDBOX_URL", url)
	}
	pod := readyNodePod(t, 10*time.Minute)
	if pod.Status.Phase != corev1.PodRunning {
		t.Errorf("cube-node Pod %s is %s after the re-install", pod.Name, pod.Status.Phase)
	}
	// The database outlives the release, so the new server loads the node's
	// old record, with the old node token, while the new cubelet registers
	// only when its backoff (up to 15 s, the server came up after it) lets
	// it. The server reports such a node Pending (its stored token gets no
	// answer) until it registers, never Ready on the strength of the old
	// record (before: Ready at once, and creates answered 503 "missing or
	// wrong node token" until the registration): Ready means it serves.
	waitCubeNodeState(t, "Ready", 10*time.Minute)
	mustCreateOne(t, "after uninstall, cleanup and a re-install")
}
