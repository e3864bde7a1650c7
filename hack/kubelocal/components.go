package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// assets are the binaries hack/kube-node-assets.sh built (cached by version).
type assets struct {
	kubeBin, helm, coredns, pause string
}

func (a assets) bin(name string) string { return filepath.Join(a.kubeBin, name) }

func etcd(c *Config, a assets) component {
	ip := c.NodeIP.String()
	return component{
		name: "etcd",
		path: a.bin("etcd"),
		args: []string{
			"--name=" + c.NodeName, "--data-dir=" + c.p("etcd"),
			"--listen-client-urls=http://" + ip + ":2379", "--advertise-client-urls=http://" + ip + ":2379",
			"--listen-peer-urls=http://" + ip + ":2380", "--initial-advertise-peer-urls=http://" + ip + ":2380",
			"--initial-cluster=" + c.NodeName + "=http://" + ip + ":2380",
			"--listen-metrics-urls=http://" + ip + ":2381",
			"--unsafe-no-fsync", // a trial cluster: speed over durability
			"--log-level=warn",
		},
		ready: httpReady("http://" + ip + ":2381/health"),
	}
}

func apiserver(c *Config, a assets) component {
	pk := func(n string) string { return c.p("pki", n) }
	ip := c.NodeIP.String()
	return component{
		name: "kube-apiserver",
		path: a.bin("kube-apiserver"),
		args: []string{
			"--etcd-servers=http://" + ip + ":2379",
			"--bind-address=" + ip, "--advertise-address=" + ip, "--secure-port=6443",
			"--service-cluster-ip-range=" + c.SvcCIDR.String(),
			"--service-node-port-range=30000-32767",
			"--client-ca-file=" + pk("ca.crt"),
			"--tls-cert-file=" + pk("apiserver.crt"), "--tls-private-key-file=" + pk("apiserver.key"),
			"--kubelet-client-certificate=" + pk("apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + pk("apiserver-kubelet-client.key"),
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + pk("sa.pub"), "--service-account-signing-key-file=" + pk("sa.key"),
			"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
			// The Node's name is not in any DNS the apiserver uses: reach the
			// kubelet (logs, exec) at its IP.
			"--kubelet-preferred-address-types=InternalIP",
			"--allow-privileged=true", "--cert-dir=" + c.p("pki", "apiserver-certs"), "--profiling=false",
		},
		ready: httpReady("https://" + ip + ":6443/readyz"),
	}
}

func controllerManager(c *Config, a assets) component {
	pk := func(n string) string { return c.p("pki", n) }
	kc := pk("controller-manager.kubeconfig")
	return component{
		name: "kube-controller-manager",
		path: a.bin("kube-controller-manager"),
		args: []string{
			"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=" + c.NodeIP.String(), "--secure-port=10257", "--leader-elect=false",
			"--cluster-signing-cert-file=" + pk("ca.crt"), "--cluster-signing-key-file=" + pk("ca.key"),
			"--root-ca-file=" + pk("ca.crt"), "--service-account-private-key-file=" + pk("sa.key"),
			"--use-service-account-credentials=true",
			"--allocate-node-cidrs=true", "--cluster-cidr=" + c.PodCIDR.String(), "--node-cidr-mask-size=24",
			"--service-cluster-ip-range=" + c.SvcCIDR.String(), "--cluster-name=cube-local",
			"--cert-dir=" + c.p("pki", "controller-manager-certs"), "--profiling=false",
		},
		ready: httpReady("https://" + c.NodeIP.String() + ":10257/healthz"),
	}
}

func scheduler(c *Config, a assets) component {
	kc := c.p("pki", "scheduler.kubeconfig")
	return component{
		name: "kube-scheduler",
		path: a.bin("kube-scheduler"),
		args: []string{
			"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=" + c.NodeIP.String(), "--secure-port=10259", "--leader-elect=false",
			"--cert-dir=" + c.p("pki", "scheduler-certs"), "--profiling=false",
		},
		ready: httpReady("https://" + c.NodeIP.String() + ":10259/healthz"),
	}
}

// containerd 1.6 with its own config: every directory under Dir (it still
// puts shim sockets under /run/containerd/s: host.go records that path).
func containerd(c *Config) (component, error) {
	d := c.p("containerd")
	cfg := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %[3]q

[ttrpc]
  address = "%[3]s.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[6]q
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[7]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.containerdSock(), filepath.Join(d, "opt"),
		c.pauseImage(), c.p("runc"), c.p("cni", "net.d"))
	if err := writeFile(filepath.Join(d, "config.toml"), cfg); err != nil {
		return component{}, err
	}
	return component{
		name:  "containerd",
		path:  "/usr/bin/containerd",
		args:  []string{"--config", filepath.Join(d, "config.toml"), "--log-level", "warn"},
		ready: dialReady("unix:" + c.containerdSock()),
	}, nil
}

// cniConfig is the pod network: one bridge, host-local addresses from the
// node's /24, and routes only to the Services, the node IP and the bridge's
// subnet: no default route, no masquerading, so nothing a Pod sends leaves
// this machine.
func cniConfig(c *Config) error {
	gw := c.NodeCIDR.Addr().Next()
	conf := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "cube-local",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": %q}, {"dst": "%s/32"}]
      }
    }
  ]
}
`, c.p("cni", "ipam"), c.NodeCIDR.String(), gw.String(), c.SvcCIDR.String(), c.NodeIP.String())
	return writeFile(c.p("cni", "net.d", "10-cube-local.conflist"), conf)
}

func kubelet(c *Config, a assets) (component, error) {
	d := c.p("kubelet")
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: %[1]s
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[2]q}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podCIDR: %[3]s
clusterDNS: [%[4]s]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
containerRuntimeEndpoint: unix://%[5]s
imageServiceEndpoint: unix://%[5]s
podLogsDir: %[6]q
staticPodPath: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
evictionHard: {memory.available: 100Mi, nodefs.available: 2%%, imagefs.available: 2%%, nodefs.inodesFree: 2%%}
protectKernelDefaults: false
`, c.NodeIP, c.p("pki", "ca.crt"), c.NodeCIDR, c.DNSIP, c.containerdSock(), c.p("pod-logs"))
	if err := writeFile(filepath.Join(d, "config.yaml"), cfg); err != nil {
		return component{}, err
	}
	return component{
		name: "kubelet",
		path: a.bin("kubelet"),
		args: []string{
			"--config=" + filepath.Join(d, "config.yaml"), "--kubeconfig=" + c.p("pki", "kubelet.kubeconfig"),
			"--root-dir=" + filepath.Join(d, "root"), "--cert-dir=" + filepath.Join(d, "pki"),
			"--node-ip=" + c.NodeIP.String(), "--hostname-override=" + c.NodeName, "--v=1",
		},
		ready: httpReady("http://" + c.NodeIP.String() + ":10248/healthz"),
	}, nil
}

func kubeProxy(c *Config, a assets) (component, error) {
	ip := c.NodeIP.String()
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: %s:10256
metricsBindAddress: %s:10249
nodePortAddresses: [%s/32]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, c.p("pki", "kube-proxy.kubeconfig"), c.PodCIDR, c.NodeName, ip, ip, ip, ip)
	path := c.p("kube-proxy", "config.yaml")
	if err := writeFile(path, cfg); err != nil {
		return component{}, err
	}
	return component{
		name:  "kube-proxy",
		path:  a.bin("kube-proxy"),
		args:  []string{"--config=" + path},
		ready: httpReady("http://" + ip + ":10256/healthz"),
	}, nil
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// readAssets runs hack/kube-node-assets.sh (cached; builds on first use).
func readAssets(ctx context.Context, c *Config) (assets, error) {
	out, err := run(ctx, c.Repo, nil, "bash", filepath.Join(c.Repo, "hack/kube-node-assets.sh"))
	if err != nil {
		return assets{}, err
	}
	var a assets
	for _, l := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(l), "=")
		switch k {
		case "KUBE_BIN_DIR":
			a.kubeBin = v
		case "HELM":
			a.helm = v
		case "COREDNS":
			a.coredns = v
		case "PAUSE":
			a.pause = v
		}
	}
	if a.kubeBin == "" || a.helm == "" || a.coredns == "" || a.pause == "" {
		return assets{}, fmt.Errorf("hack/kube-node-assets.sh printed no complete asset list:\n%s", out)
	}
	return a, nil
}
