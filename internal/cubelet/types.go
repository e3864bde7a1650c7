package cubelet

import (
	"net/netip"
	"time"
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
	// NodeMayChooseToken lets the cubelet give the sandbox a token of its
	// own instead of EnvdAccessToken: a pre-started slot's, when no env
	// vars are asked for either, so envd needs no /init at all. The token
	// in use is returned in Sandbox.EnvdAccessToken.
	NodeMayChooseToken bool
	AllowInternet      bool
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
	// NodeID names the node the sandbox runs on; set by a multi-node
	// scheduler (empty from a single in-process cubelet).
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
