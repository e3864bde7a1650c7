package cubevs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"

	"github.com/cube-dev/cube/internal/errdefs"
)

// Config describes one node dataplane. Every name and range is configurable
// so several dataplanes (simulated nodes, parallel tests) can share a host.
type Config struct {
	// RunDir holds the netns pins under RunDir/netns. Default /run/cube.
	RunDir string
	// DPName is the dataplane netns name, pinned at RunDir/netns/DPName.
	DPName string
	// HostVeth is the host side of the veth pair into the dataplane netns.
	HostVeth string
	// HostNetNSPath names the host network namespace (e.g. /proc/1/ns/net
	// when cubelet runs in a Pod with hostPID). Empty means the network
	// namespace of the thread calling Open.
	HostNetNSPath string
	// NodeCIDR is the sandbox address range; it is only routed inside the
	// dataplane netns, never on the host. Its first usable address is the
	// sandboxes' gateway.
	NodeCIDR netip.Prefix
	// Transit is the host<->dataplane subnet (/30 or larger): first usable
	// address on HostVeth, second inside the dataplane netns.
	Transit netip.Prefix
	// PortMin and PortMax bound the host ports that may be mapped. The host
	// DNATs this whole range on its local addresses to the dataplane.
	PortMin, PortMax uint16
	// TablePrefix names the nftables tables (family ip) in the host and
	// the dataplane netns.
	TablePrefix string
	// MTU of the veths; 0 means the MTU of the host's default-route link
	// (1500 when there is none).
	MTU int
}

// DefaultConfig returns the production defaults.
func DefaultConfig() Config {
	return Config{
		RunDir:      "/run/cube",
		DPName:      "cube-dp",
		HostVeth:    "cube0",
		NodeCIDR:    netip.MustParsePrefix("172.16.0.0/18"),
		Transit:     netip.MustParsePrefix("169.254.250.0/30"),
		PortMin:     20000,
		PortMax:     29999,
		TablePrefix: "cube",
	}
}

// uplinkName is the dataplane-side name of the host veth pair. It lives in
// the dataplane netns, so it never collides across dataplanes.
const uplinkName = "uplink"

// sandboxIfName is the interface name inside each sandbox netns.
const sandboxIfName = "eth0"

var (
	ifNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)
	ownerRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)
	tableRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
)

func (c Config) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("cubevs config: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	switch {
	case c.RunDir == "" || !filepath.IsAbs(c.RunDir):
		return bad("RunDir %q must be an absolute path", c.RunDir)
	case !ownerRe.MatchString(c.DPName):
		return bad("DPName %q", c.DPName)
	case !ifNameRe.MatchString(c.HostVeth):
		return bad("HostVeth %q must be a valid interface name (max 15 chars)", c.HostVeth)
	case !tableRe.MatchString(c.TablePrefix):
		return bad("TablePrefix %q", c.TablePrefix)
	case !c.NodeCIDR.IsValid() || !c.NodeCIDR.Addr().Is4() || c.NodeCIDR.Bits() > 29:
		return bad("NodeCIDR %s must be an IPv4 prefix of /29 or larger", c.NodeCIDR)
	case !c.Transit.IsValid() || !c.Transit.Addr().Is4() || c.Transit.Bits() > 30:
		return bad("Transit %s must be an IPv4 prefix of /30 or larger", c.Transit)
	case c.Transit.Overlaps(c.NodeCIDR):
		return bad("Transit %s overlaps NodeCIDR %s", c.Transit, c.NodeCIDR)
	case c.PortMin == 0 || c.PortMax < c.PortMin:
		return bad("port range %d-%d", c.PortMin, c.PortMax)
	case c.MTU < 0 || (c.MTU > 0 && c.MTU < 576):
		return bad("MTU %d", c.MTU)
	}
	return nil
}

// transitHost is the address of HostVeth.
func (c Config) transitHost() netip.Addr { return c.Transit.Masked().Addr().Next() }

// transitPeer is the dataplane end of the transit link; the host DNATs
// mapped ports to it.
func (c Config) transitPeer() netip.Addr { return c.transitHost().Next() }

// gateway is the sandboxes' default gateway inside the dataplane netns.
func (c Config) gateway() netip.Addr { return c.NodeCIDR.Masked().Addr().Next() }

func (c Config) netnsDir() string               { return filepath.Join(c.RunDir, "netns") }
func (c Config) dpPin() string                  { return filepath.Join(c.netnsDir(), c.DPName) }
func (c Config) sandboxPin(owner string) string { return filepath.Join(c.netnsDir(), owner) }

// SandboxNetNSPath is where the netns of an endpoint attached for owner is
// pinned.
func (c Config) SandboxNetNSPath(owner string) string { return c.sandboxPin(owner) }

// validOwner checks that a sandbox id is safe as a file and chain name.
func (c Config) validOwner(owner string) error {
	if !ownerRe.MatchString(owner) || owner == c.DPName {
		return fmt.Errorf("sandbox id %q: want 1-128 of [A-Za-z0-9_.-], not %q: %w",
			owner, c.DPName, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validSandboxIP checks that ip is a usable host address of NodeCIDR.
func (c Config) validSandboxIP(ip netip.Addr) error {
	p := c.NodeCIDR.Masked()
	if !ip.Is4() || !p.Contains(ip) || ip == p.Addr() || ip == c.gateway() || ip == lastAddr(p) {
		return fmt.Errorf("sandbox ip %s: not a usable address of %s (network, gateway %s and broadcast are reserved): %w",
			ip, p, c.gateway(), errdefs.ErrInvalidArgument)
	}
	return nil
}

// LinkName returns the interface name, inside the dataplane netns, of the
// veth that serves owner: "cv" + the id when it fits, otherwise "cv" + the
// first 6 characters + 7 hex digits of the id's SHA-256, so names carry the
// owner and stay unique. The link alias holds the full id.
func LinkName(owner string) string {
	if len(owner) <= 13 {
		return "cv" + owner
	}
	sum := sha256.Sum256([]byte(owner))
	return "cv" + owner[:6] + hex.EncodeToString(sum[:])[:7]
}

// chainName is the per-sandbox egress chain in the dataplane table.
func chainName(owner string) string { return "sb-" + owner }
