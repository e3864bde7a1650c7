package main

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
)

// Config is the whole cluster's layout. Every path the cluster writes is
// under Dir, except what the components hard-code (host.go records those).
type Config struct {
	Repo      string // Cube's source tree (chart, hack/images)
	Dir       string // CUBE_KUBE_DIR: all state, logs, pids, configs
	CacheDir  string // CUBE_CACHE_DIR: binaries, kept by kube-down
	NodeName  string
	NodeIP    netip.Addr // a /32 on lo; every component binds to it
	PodCIDR   netip.Prefix
	NodeCIDR  netip.Prefix // this node's share of PodCIDR (the bridge's subnet)
	SvcCIDR   netip.Prefix
	APIIP     netip.Addr // first Service IP: the kubernetes Service
	DNSIP     netip.Addr // CoreDNS Service
	PGPort    int
	Namespace string
	Release   string
	ImageRepo string // images are <ImageRepo>/<name>:<tag>
	Version   string // Cube's version (internal/version) the tags derive from
	Tag       string // the build installed
	TagNext   string // the second build (a "cubelet image bump")
}

// envOr returns $key or def.
func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func loadConfig() (*Config, error) {
	repo, err := repoRoot()
	if err != nil {
		return nil, err
	}
	c := &Config{
		Repo:      repo,
		Dir:       envOr("CUBE_KUBE_DIR", "/var/lib/cube-kube"),
		CacheDir:  envOr("CUBE_CACHE_DIR", "/var/cache/cube"),
		NodeName:  envOr("CUBE_KUBE_NODE", "cube-local"),
		Namespace: envOr("CUBE_KUBE_NAMESPACE", "cube-system"),
		Release:   envOr("CUBE_KUBE_RELEASE", "cube"),
		ImageRepo: envOr("CUBE_KUBE_IMAGE_REPO", "cube.local"),
		PGPort:    5432,
	}
	parse := func(key, def string, p *netip.Prefix) {
		if err == nil {
			*p, err = netip.ParsePrefix(envOr(key, def))
		}
	}
	var nodeIP netip.Prefix
	parse("CUBE_KUBE_NODE_IP", "10.250.0.1/32", &nodeIP)
	parse("CUBE_KUBE_POD_CIDR", "10.244.0.0/16", &c.PodCIDR)
	parse("CUBE_KUBE_SERVICE_CIDR", "10.96.0.0/16", &c.SvcCIDR)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c.NodeIP = nodeIP.Addr()
	c.NodeCIDR = netip.PrefixFrom(c.PodCIDR.Addr(), 24)
	c.APIIP = c.SvcCIDR.Addr().Next()
	c.DNSIP = c.SvcCIDR.Addr()
	for range 10 {
		c.DNSIP = c.DNSIP.Next()
	}
	if c.Version, err = cubeVersion(repo); err != nil {
		return nil, err
	}
	// Two builds of the same version, told apart by a pre-release suffix the
	// version-skew policy ignores.
	c.Tag = envOr("CUBE_KUBE_IMAGE_TAG", c.Version+"-local.1")
	c.TagNext = envOr("CUBE_KUBE_IMAGE_TAG_NEXT", c.Version+"-local.2")
	return c, nil
}

// repoRoot is the Cube tree kubelocal runs from (make runs it at the top).
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "deploy/kubernetes/chart/Chart.yaml")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("run kubelocal inside Cube's source tree (no deploy/kubernetes/chart above %s)", wd)
}

var versionRE = regexp.MustCompile(`(?m)^var Version = "([^"]+)"`)

func cubeVersion(repo string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, "internal/version/version.go"))
	if err != nil {
		return "", fmt.Errorf("read Cube's version: %w", err)
	}
	m := versionRE.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("no `var Version = \"...\"` in internal/version/version.go")
	}
	return string(m[1]), nil
}

// p joins path elements under Dir.
func (c *Config) p(elem ...string) string { return filepath.Join(append([]string{c.Dir}, elem...)...) }

func (c *Config) kubeconfig() string            { return c.p("kubeconfig") }
func (c *Config) binDir() string                { return c.p("bin") }
func (c *Config) containerdSock() string        { return c.p("containerd", "containerd.sock") }
func (c *Config) cubeBin() string               { return c.p("bin", "cube") }
func (c *Config) chart() string                 { return filepath.Join(c.Repo, "deploy/kubernetes/chart") }
func (c *Config) valuesFile() string            { return c.p("values.yaml") }
func (c *Config) image(name, tag string) string { return c.ImageRepo + "/" + name + ":" + tag }
func (c *Config) pauseImage() string            { return c.ImageRepo + "/pause:1" }
func (c *Config) corednsImage() string          { return c.ImageRepo + "/coredns:1" }
