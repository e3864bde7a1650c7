package master

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Network is a sandbox's network configuration as the E2B API carries it
// (create body `network`, detail `network`). It is persisted as JSON.
type Network struct {
	// AllowOut entries are CIDRs, bare IPs or domain names ("*.example.com").
	AllowOut []string `json:"allowOut,omitempty"`
	// DenyOut entries are CIDRs or bare IPs.
	DenyOut            []string                 `json:"denyOut,omitempty"`
	AllowPublicTraffic *bool                    `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    string                   `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int                    `json:"httpsPorts,omitempty"`
	EgressProxy        *EgressProxy             `json:"egressProxy,omitempty"`
	Rules              map[string][]NetworkRule `json:"rules,omitempty"`
}

// EgressProxy is a SOCKS5 proxy for the sandbox's egress traffic.
type EgressProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// NetworkRule transforms matching outbound HTTPS requests.
type NetworkRule struct {
	Transform *struct {
		Headers map[string]string `json:"headers,omitempty"`
	} `json:"transform,omitempty"`
}

// NetworkPolicy is what a NetworkUpdater enforces.
type NetworkPolicy struct {
	AllowInternet bool
	Network       Network
}

// NetworkUpdate replaces a running sandbox's egress rules (PUT …/network).
// Omitted fields clear the current value.
type NetworkUpdate struct {
	AllowInternetAccess *bool
	AllowOut            []string
	DenyOut             []string
	EgressProxy         *EgressProxy
	Rules               map[string][]NetworkRule
}

func (n *Network) hasEgressRules() bool {
	return n != nil && (len(n.AllowOut) > 0 || len(n.DenyOut) > 0 || n.EgressProxy != nil || len(n.Rules) > 0)
}

// validate checks every field a node would act on.
func (n *Network) validate() error {
	if n == nil {
		return nil
	}
	if err := validateEgress(n.AllowOut, n.DenyOut, n.EgressProxy, n.Rules); err != nil {
		return err
	}
	for _, p := range n.HTTPSPorts {
		if p < 1 || p > 65535 || p == 49983 {
			return fmt.Errorf("%w: network.httpsPorts: %d is not a usable port (1-65535, not 49983)", errdefs.ErrInvalidArgument, p)
		}
	}
	if len(n.MaskRequestHost) > 253 {
		return fmt.Errorf("%w: network.maskRequestHost is too long", errdefs.ErrInvalidArgument)
	}
	return nil
}

const maxNetworkEntries = 1024

func validateEgress(allowOut, denyOut []string, proxy *EgressProxy, rules map[string][]NetworkRule) error {
	if len(allowOut)+len(denyOut) > maxNetworkEntries {
		return fmt.Errorf("%w: network: at most %d allowOut+denyOut entries", errdefs.ErrInvalidArgument, maxNetworkEntries)
	}
	for _, e := range allowOut {
		if !isCIDROrIP(e) && !isDomainPattern(e) {
			return fmt.Errorf("%w: network.allowOut: %q is not a CIDR, IP address or domain name", errdefs.ErrInvalidArgument, e)
		}
	}
	for _, e := range denyOut {
		if !isCIDROrIP(e) {
			return fmt.Errorf("%w: network.denyOut: %q is not a CIDR or IP address (domains are not supported in denyOut)", errdefs.ErrInvalidArgument, e)
		}
	}
	if proxy != nil {
		host, port, err := net.SplitHostPort(proxy.Address)
		if err != nil || host == "" {
			return fmt.Errorf("%w: network.egressProxy.address %q must be host:port", errdefs.ErrInvalidArgument, proxy.Address)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("%w: network.egressProxy.address %q has an invalid port", errdefs.ErrInvalidArgument, proxy.Address)
		}
		if len(proxy.Username) > 255 || len(proxy.Password) > 255 {
			return fmt.Errorf("%w: network.egressProxy username and password are limited to 255 bytes", errdefs.ErrInvalidArgument)
		}
	}
	for host := range rules {
		if host == "*" || !isDomainPattern(host) {
			return fmt.Errorf("%w: network.rules: %q is not a domain name or *.domain pattern", errdefs.ErrInvalidArgument, host)
		}
	}
	return nil
}

func isCIDROrIP(s string) bool {
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// isDomainPattern accepts a DNS name, optionally with one leading "*." label.
func isDomainPattern(s string) bool {
	s = strings.TrimPrefix(strings.TrimSuffix(s, "."), "*.")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// UpdateNetwork validates u, asks the node to enforce it (the node must
// implement NetworkUpdater, else errdefs.ErrNotImplemented) and stores it.
func (m *Master) UpdateNetwork(ctx context.Context, id string, u NetworkUpdate) error {
	u.Rules = lowerKeys(u.Rules)
	if err := validateEgress(u.AllowOut, u.DenyOut, u.EgressProxy, u.Rules); err != nil {
		return fmt.Errorf("update network of sandbox %s: %w", id, err)
	}
	unlock := m.locks.lock(id)
	defer unlock()
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("update network: %w", err)
	}
	updater, ok := m.node.(NetworkUpdater)
	if !ok {
		return fmt.Errorf("update network of sandbox %s: %w: this node cannot change a sandbox's network", id, errdefs.ErrNotImplemented)
	}
	var n Network
	if len(sb.Network) > 0 {
		if err := json.Unmarshal(sb.Network, &n); err != nil {
			return fmt.Errorf("update network of sandbox %s: stored network: %w", id, err)
		}
	}
	n.AllowOut, n.DenyOut, n.EgressProxy, n.Rules = u.AllowOut, u.DenyOut, u.EgressProxy, u.Rules
	allow := u.AllowInternetAccess == nil || *u.AllowInternetAccess
	if err := updater.UpdateNetwork(ctx, id, NetworkPolicy{AllowInternet: allow, Network: n}); err != nil {
		return fmt.Errorf("update network of sandbox %s: %w", id, err)
	}
	raw, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("update network of sandbox %s: %w", id, err)
	}
	if err := m.store.SetNetwork(ctx, id, raw, u.AllowInternetAccess); err != nil {
		return fmt.Errorf("update network: %w", err)
	}
	return nil
}

// lowerKeys normalises rule hosts to lowercase, as E2B does on write.
func lowerKeys(rules map[string][]NetworkRule) map[string][]NetworkRule {
	if rules == nil {
		return nil
	}
	out := make(map[string][]NetworkRule, len(rules))
	for k, v := range rules {
		out[strings.ToLower(k)] = v
	}
	return out
}
