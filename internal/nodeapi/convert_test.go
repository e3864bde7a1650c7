package nodeapi

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/nodeproto"
)

// TestSandboxSurvivesTheWire: every field of a node's sandbox view,
// including the envd token a node chose at create, crosses the node API.
func TestSandboxSurvivesTheWire(t *testing.T) {
	in := nodeproto.Sandbox{
		ID: "abc", Template: "base", IP: netip.MustParseAddr("10.222.0.9"), EnvdVersion: "0.5.7",
		CPUCount: 2, MemoryMB: 512, DiskSizeMB: 2048, StartedAt: time.UnixMilli(1_700_000_000_123).UTC(),
		EnvdAccessToken: "0123456789abcdef",
	}
	if out := sandboxFromProto(sandboxToProto(in)); out != in {
		t.Fatalf("after the wire: %+v, want %+v", out, in)
	}
}
