package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
)

// up starts the cluster from nothing (a previous one, whole or half made,
// is taken down first) and installs Cube on it.
func up(ctx context.Context, c *Config) (err error) {
	start := time.Now()
	if _, err := os.Stat(c.hostFile()); err == nil {
		slog.Info("state of a previous cluster found: taking it down first", "dir", c.Dir)
		if err := down(ctx, c); err != nil {
			return fmt.Errorf("take down the previous cluster: %w", err)
		}
	}
	a, err := readAssets(ctx, c)
	if err != nil {
		return err
	}
	slog.Info("binaries ready", "took", time.Since(start).Round(time.Second))
	if _, err := recordHost(c); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			diagnose(context.WithoutCancel(ctx), c)
			err = fmt.Errorf("%w\n(the cluster is left as it is for inspection: logs in %s/logs; `make kube-down` removes it)", err, c.Dir)
		}
	}()
	// Everything started from here on (and containerd's shims) lives in one
	// cgroup, so kube-down finds what the pid files do not name.
	if err := cgroup.MoveAll(clusterCgroup, os.Getpid()); err != nil {
		return fmt.Errorf("enter cgroup %s: %w", clusterCgroup, err)
	}

	// Cube's images build (go run ./hack/images, twice) while the cluster starts.
	type imagesResult struct {
		tars []string
		err  error
	}
	imagesDone := make(chan imagesResult, 1)
	go func() {
		tars, err := buildCubeImages(ctx, c)
		imagesDone <- imagesResult{tars, err}
	}()
	waitImages := func() ([]string, error) {
		r := <-imagesDone
		return r.tars, r.err
	}
	defer func() {
		if err != nil {
			select { // let a running build finish writing before down removes Dir
			case <-imagesDone:
			case <-time.After(5 * time.Minute):
			}
		}
	}()

	if err := binDir(ctx, c, a); err != nil {
		return err
	}
	if err := hostNetwork(ctx, c); err != nil {
		return err
	}
	if err := makePKI(c); err != nil {
		return err
	}
	if err := startControlPlane(ctx, c, a); err != nil {
		return err
	}
	if err := startNode(ctx, c, a); err != nil {
		return err
	}
	if err := installCoreDNS(ctx, c); err != nil {
		return err
	}
	dbURL, err := startPostgres(ctx, c)
	if err != nil {
		return err
	}
	if _, err := kubectl(ctx, c, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s"); err != nil {
		return fmt.Errorf("CoreDNS: %w", err)
	}
	tars, err := waitImages()
	if err != nil {
		return err
	}
	if err := importImages(ctx, c, tars...); err != nil {
		return err
	}
	if err := installChart(ctx, c, dbURL); err != nil {
		return err
	}
	url, key, err := serverAccess(ctx, c)
	if err != nil {
		return err
	}
	if err := waitCubeNode(ctx, c, url, key, 15*time.Minute); err != nil {
		return err
	}
	env := envFile(c, url, key)
	if err := writeFile(c.p("env"), env); err != nil {
		return err
	}
	slog.Info("kube-up done", "took", time.Since(start).Round(time.Second))
	fmt.Printf("\nThe local cluster runs. To use it (also in %s):\n\n%s\n", c.p("env"), env)
	return nil
}

// binDir puts kubectl and helm (and the host's cube) in Dir/bin, the PATH
// entry the exports name.
func binDir(ctx context.Context, c *Config, a assets) error {
	if err := os.MkdirAll(c.binDir(), 0o755); err != nil {
		return err
	}
	for name, target := range map[string]string{"kubectl": a.bin("kubectl"), "helm": a.helm} {
		link := filepath.Join(c.binDir(), name)
		os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return err
		}
	}
	// cube on the host, of the installed images' version: `cube node ls`,
	// `cube node mapdump`, `cube node cleanup` for kube-down.
	_, err := run(ctx, c.Repo, []string{"CGO_ENABLED=0"}, "go", "build", "-trimpath",
		"-ldflags=-s -w -X github.com/cube-dev/cube/internal/version.Version=v"+trimV(c.Tag), "-o", c.cubeBin(), "./cmd/cube")
	return err
}

// hostNetwork puts the node IP on lo and routes the Service range to it
// (source: the node IP): kube-proxy's DNAT then sends the host's Service
// traffic to the Pods, and without kube-proxy nothing for a Service address
// leaves the machine through the default route. It turns on IP forwarding,
// as every Kubernetes node has it (kubeadm's preflight requires it): a Pod's
// packet to a Service whose backend is another Pod is routed by the host.
// host.json has the previous value; kube-down restores it.
func hostNetwork(ctx context.Context, c *Config) error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable IP forwarding: %w", err)
	}
	ip := c.NodeIP.String() + "/32"
	if out, _ := run(ctx, "/", nil, "ip", "-o", "addr", "show", "dev", "lo"); !strings.Contains(out, " "+ip+" ") {
		if _, err := run(ctx, "/", nil, "ip", "addr", "add", ip, "dev", "lo"); err != nil {
			return err
		}
	}
	_, err := run(ctx, "/", nil, "ip", "route", "replace", c.SvcCIDR.String(), "dev", "lo", "src", c.NodeIP.String())
	return err
}

func startControlPlane(ctx context.Context, c *Config, a assets) error {
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for _, comp := range []component{etcd(c, a), apiserver(c, a), controllerManager(c, a), scheduler(c, a)} {
		if _, err := start(tctx, c, comp); err != nil {
			return err
		}
	}
	return nil
}

func startNode(ctx context.Context, c *Config, a assets) error {
	tctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// The CNI config exists before containerd starts, so its CRI plugin
	// watches the directory from the start.
	if err := cniConfig(c); err != nil {
		return err
	}
	ctrd, err := containerd(c)
	if err != nil {
		return err
	}
	if _, err := start(tctx, c, ctrd); err != nil {
		return err
	}
	addons, err := addonImages(c, a)
	if err != nil {
		return err
	}
	if err := importImages(tctx, c, addons); err != nil {
		return err
	}
	kl, err := kubelet(c, a)
	if err != nil {
		return err
	}
	if _, err := start(tctx, c, kl); err != nil {
		return err
	}
	kp, err := kubeProxy(c, a)
	if err != nil {
		return err
	}
	if _, err := start(tctx, c, kp); err != nil {
		return err
	}
	for {
		_, err := kubectl(tctx, c, "wait", "node", c.NodeName, "--for=condition=Ready", "--timeout=60s")
		if err == nil {
			return nil
		}
		if tctx.Err() != nil {
			return fmt.Errorf("node %s not Ready: %w", c.NodeName, errors.Join(err, tctx.Err()))
		}
		time.Sleep(time.Second) // the Node object may not exist yet
	}
}

// envFile is the sourceable description of the cluster (the contract of
// test/kubereal and of docs/kubernetes/local-cluster.md).
func envFile(c *Config, url, key string) string {
	lines := []string{
		"export KUBECONFIG=" + c.kubeconfig(),
		"export PATH=" + c.binDir() + ":$PATH",
		fmt.Sprintf("export E2B_API_URL=%s E2B_SANDBOX_URL=%s E2B_API_KEY=%s", url, url, key),
		"export CUBE_KUBE_DIR=" + c.Dir,
		"export CUBE_KUBE_NAMESPACE=" + c.Namespace,
		"export CUBE_KUBE_RELEASE=" + c.Release,
		"export CUBE_KUBE_CHART=" + c.chart(),
		"export CUBE_KUBE_VALUES=" + c.valuesFile(),
		"export CUBE_KUBE_IMAGE_REPO=" + c.ImageRepo,
		"export CUBE_KUBE_IMAGE_TAG=" + c.Tag,
		"export CUBE_KUBE_IMAGE_TAG_NEXT=" + c.TagNext,
		"export CUBE_KUBE_NODE=" + c.NodeName,
		"export CUBE_BIN=" + c.cubeBin(),
	}
	return strings.Join(lines, "\n") + "\n"
}
