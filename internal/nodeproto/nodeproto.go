// Package nodeproto holds the types the control plane and a node agent
// exchange: what a create asks for, what a node reports about a sandbox,
// its counters and its egress policy. It is a leaf: the control plane
// (master, cluster, api) speaks in these types without importing the node
// agent and its kernel libraries (netlink, nftables, eBPF, bbolt), and the
// node agent (cubelet) implements them. nodeapi carries them over Connect.
package nodeproto

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// CreateRequest is what the control plane asks a node for. The server has
// already chosen the sandbox id and envd access token.
type CreateRequest struct {
	SandboxID       string
	Template        string
	CPUCount        int // 0 = template default
	MemoryMB        int // 0 = template default
	EnvVars         map[string]string
	EnvdAccessToken string
	// NodeMayChooseToken lets the node give the sandbox a token of its
	// own instead of EnvdAccessToken: a pre-started slot's, when no env
	// vars are asked for either, so envd needs no /init at all. The token
	// in use is returned in Sandbox.EnvdAccessToken.
	NodeMayChooseToken bool
	AllowInternet      bool
	// WritableOnHost makes a build sandbox: no disk image, so its overlay
	// upper dir stays on the host's filesystem where CommitSandbox can read
	// it. The template's disk size limit does not apply to it.
	WritableOnHost bool
}

// CommitRequest asks a node to register the filesystem of a running
// WritableOnHost sandbox as a new template (the sandbox keeps running).
type CommitRequest struct {
	SandboxID string
	// Name is the template to register (template name rules); a template
	// of that name is replaced.
	Name string
	// CPUCount and MemoryMB are the new template's; 0 = the parent's.
	CPUCount, MemoryMB int
	// Defaults are merged onto the parent template's: Env overlaid, the
	// others replaced when non-empty.
	Defaults TemplateDefaults
}

// TemplateDefaults are what the processes of a template's sandboxes get
// unless a request says otherwise.
type TemplateDefaults struct {
	Env     map[string]string
	Workdir string
	User    string
	// StartCmd runs when a sandbox of the template starts; ReadyCmd must
	// then succeed before the create returns.
	StartCmd string
	ReadyCmd string
}

// Template is a template a node holds, as CommitSandbox reports it.
type Template struct {
	Name       string
	Digest     string
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	// Layers are the digests of the template's layer stack, bottom first
	// (one, the Digest, for a flat template; none from older nodes).
	Layers []string
	// DefaultsJSON is the template's sandbox defaults as its template.json
	// records them (nil for none).
	DefaultsJSON []byte
}

// Sandbox is the live view of a sandbox on a node.
type Sandbox struct {
	ID          string
	Template    string
	IP          netip.Addr
	EnvdVersion string
	CPUCount    int
	MemoryMB    int
	DiskSizeMB  int
	StartedAt   time.Time
	// EnvdAccessToken is the token envd accepts; set by CreateSandbox only.
	EnvdAccessToken string
	// NodeID names the node the sandbox runs on; set by the registry that
	// scheduled it (empty from the node itself).
	NodeID string
}

// Metrics are read from the sandbox's cgroup and writable layer.
type Metrics struct {
	Timestamp  time.Time
	CPUCount   int
	CPUUsedPct float64
	MemUsed    int64
	MemTotal   int64
	MemCache   int64
	DiskUsed   int64
	DiskTotal  int64
}

// EgressPolicy is a sandbox's outbound network policy: internet access on
// or off, with CIDR allow and deny lists on top.
type EgressPolicy struct {
	AllowInternet bool
	AllowOut      []netip.Prefix
	DenyOut       []netip.Prefix
}

// Equal reports whether p and q install the same rules.
func (p EgressPolicy) Equal(q EgressPolicy) bool {
	return p.AllowInternet == q.AllowInternet && slices.Equal(p.AllowOut, q.AllowOut) && slices.Equal(p.DenyOut, q.DenyOut)
}

// ParsePrefixes turns CIDRs or bare IP addresses into prefixes. Domain
// names need an L7 egress proxy that nodes do not have: they are refused
// with errdefs.ErrNotImplemented.
func ParsePrefixes(entries []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(entries))
	for _, e := range entries {
		if p, err := netip.ParsePrefix(e); err == nil {
			out = append(out, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(e); err == nil {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		return nil, fmt.Errorf("egress rule %q: only CIDRs and IP addresses are supported on this node: %w", e, errdefs.ErrNotImplemented)
	}
	return out, nil
}
