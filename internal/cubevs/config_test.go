package cubevs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestLinkName(t *testing.T) {
	cases := map[string]string{
		"a":             "cva",
		"abcdefghijklm": "cvabcdefghijklm",
	}
	for owner, want := range cases {
		if got := LinkName(owner); got != want {
			t.Errorf("LinkName(%q) = %q, want %q", owner, got, want)
		}
	}
	long1, long2 := LinkName("i1a2b3c4d5e6f7g8h9"), LinkName("i1a2b3c4d5e6f7g8h0")
	if len(long1) != 15 || !strings.HasPrefix(long1, "cvi1a2b3") || long1 == long2 {
		t.Errorf("long ids: %q, %q: want 15 chars, owner prefix, distinct", long1, long2)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().validate(); err != nil {
		t.Fatalf("DefaultConfig invalid: %v", err)
	}
	mut := map[string]func(*Config){
		"relative run dir":  func(c *Config) { c.RunDir = "run" },
		"long host veth":    func(c *Config) { c.HostVeth = "abcdefghijklmnop" },
		"bad dp name":       func(c *Config) { c.DPName = "../x" },
		"bad table":         func(c *Config) { c.TablePrefix = "a b" },
		"ipv6 node cidr":    func(c *Config) { c.NodeCIDR = netip.MustParsePrefix("fd00::/64") },
		"transit too small": func(c *Config) { c.Transit = netip.MustParsePrefix("169.254.1.0/31") },
		"transit overlaps":  func(c *Config) { c.Transit = netip.MustParsePrefix("172.16.0.0/30") },
		"inverted ports":    func(c *Config) { c.PortMin, c.PortMax = 2, 1 },
		"tiny mtu":          func(c *Config) { c.MTU = 100 },
	}
	for name, f := range mut {
		c := DefaultConfig()
		f(&c)
		if err := c.validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
	c := DefaultConfig()
	for _, owner := range []string{"", "../x", "a/b", ".hidden", c.DPName, strings.Repeat("a", 129)} {
		if err := c.validOwner(owner); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("validOwner(%q) = %v, want ErrInvalidArgument", owner, err)
		}
	}
	for _, ip := range []string{"172.16.0.0", "172.16.0.1", "172.16.63.255", "172.16.64.1", "10.0.0.1"} {
		if err := c.validSandboxIP(netip.MustParseAddr(ip)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("validSandboxIP(%s) = %v, want ErrInvalidArgument", ip, err)
		}
	}
	if err := c.validSandboxIP(netip.MustParseAddr("172.16.63.254")); err != nil {
		t.Errorf("validSandboxIP(172.16.63.254) = %v", err)
	}
}
