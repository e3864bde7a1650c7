package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// hostRecord is what the host looked like before kube-up changed it, kept
// in Dir/host.json so kube-down can put it back, even after a kube-up that
// failed half way.
type hostRecord struct {
	// Sysctls maps /proc/sys paths to their values before the cluster ran.
	Sysctls map[string]string `json:"sysctls"`
	// Existed maps the paths components create outside Dir to whether they
	// were there before; kube-down removes only those that were not.
	Existed map[string]bool `json:"existed"`
	// NftTables are the nftables tables ("family name") there were.
	NftTables []string `json:"nftTables"`
}

// touchedSysctls are the kernel settings the components change: the
// kubelet's kernel tunables (vm.overcommit_memory, kernel.panic, ...), the
// bridge plugin's IP forwarding, kube-proxy's conntrack and route_localnet.
var touchedSysctls = []string{
	"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward", "net/ipv4/conf/all/forwarding", "net/ipv4/conf/default/forwarding",
	"net/ipv6/conf/all/forwarding", "net/ipv6/conf/default/forwarding",
	"net/ipv4/conf/all/route_localnet", "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
	"net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait", "net/netfilter/nf_conntrack_tcp_be_liberal",
}

// outsidePaths are created by components (or Cube's chart) outside Dir
// whatever their configuration says.
var outsidePaths = []string{
	"/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd", "/opt/containerd",
	"/var/lib/cni", "/etc/cni", "/opt/cni", "/run/cube", "/var/lib/cube", "/etc/kubernetes",
}

func (c *Config) hostFile() string { return c.p("host.json") }

// recordHost writes host.json unless it exists (a second kube-up after a
// failed one must not take the changed host for the original).
func recordHost(c *Config) (*hostRecord, error) {
	if r, err := loadHost(c); err == nil {
		return r, nil
	}
	r := &hostRecord{Sysctls: map[string]string{}, Existed: map[string]bool{}}
	for _, s := range touchedSysctls {
		b, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err == nil {
			r.Sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	for _, p := range outsidePaths {
		_, err := os.Lstat(p)
		r.Existed[p] = err == nil
	}
	ts, err := nftTables(context.Background())
	if err != nil {
		return nil, err
	}
	r.NftTables = ts
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(c.hostFile(), b, 0o644); err != nil {
		return nil, fmt.Errorf("record host state: %w", err)
	}
	return r, nil
}

func loadHost(c *Config) (*hostRecord, error) {
	b, err := os.ReadFile(c.hostFile())
	if err != nil {
		return nil, err
	}
	var r hostRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", c.hostFile(), err)
	}
	return &r, nil
}

// restoreSysctls writes back every recorded value that changed.
func restoreSysctls(r *hostRecord) error {
	var errs []error
	for s, v := range r.Sysctls {
		p := filepath.Join("/proc/sys", s)
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) == v {
			continue
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", s, v, err))
			continue
		}
		slog.Info("restored sysctl", "key", strings.ReplaceAll(s, "/", "."), "value", v, "was", strings.TrimSpace(string(b)))
	}
	return errors.Join(errs...)
}

// removeCreatedPaths removes the outside paths that did not exist before.
// Mounts under them must be gone first (down unmounts them).
func removeCreatedPaths(r *hostRecord) error {
	var errs []error
	for _, p := range outsidePaths {
		existed, known := r.Existed[p]
		if !known || existed {
			continue
		}
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			continue
		}
		slog.Info("removed", "path", p)
	}
	return errors.Join(errs...)
}
