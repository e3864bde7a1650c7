package cubevs

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestNextFreeIP(t *testing.T) {
	a := netip.MustParseAddr
	cases := []struct {
		name   string
		prefix string
		taken  []string
		want   string
		err    error
	}{
		{"first skips network and gateway", "172.16.0.0/18", nil, "172.16.0.2", nil},
		{"unmasked prefix", "172.16.5.9/18", nil, "172.16.0.2", nil},
		{"skips taken", "10.0.0.0/29", []string{"10.0.0.2", "10.0.0.3"}, "10.0.0.4", nil},
		{"fills a hole", "10.0.0.0/29", []string{"10.0.0.2", "10.0.0.4"}, "10.0.0.3", nil},
		{"last before broadcast", "10.0.0.0/29", []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"}, "10.0.0.6", nil},
		{"full /29", "10.0.0.0/29", []string{"10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}, "", errdefs.ErrResourceExhausted},
		{"/30 has one", "10.0.0.0/30", nil, "10.0.0.2", nil},
		{"/30 full", "10.0.0.0/30", []string{"10.0.0.2"}, "", errdefs.ErrResourceExhausted},
		{"/31 invalid", "10.0.0.0/31", nil, "", errdefs.ErrInvalidArgument},
		{"ipv6 invalid", "fd00::/64", nil, "", errdefs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			taken := map[netip.Addr]bool{}
			for _, s := range c.taken {
				taken[a(s)] = true
			}
			got, err := NextFreeIP(netip.MustParsePrefix(c.prefix), taken)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				return
			}
			if err != nil || got != a(c.want) {
				t.Fatalf("got %v, %v; want %s", got, err, c.want)
			}
		})
	}
	if _, err := NextFreeIP(netip.Prefix{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("zero prefix: err = %v", err)
	}
}

func TestNextFreePort(t *testing.T) {
	cases := []struct {
		name     string
		min, max uint16
		taken    []uint16
		start    uint16
		want     uint16
		err      error
	}{
		{"first", 20000, 29999, nil, 0, 20000, nil},
		{"from start", 20000, 29999, nil, 25000, 25000, nil},
		{"skips taken", 20000, 20005, []uint16{20000, 20001}, 20000, 20002, nil},
		{"wraps around", 20000, 20005, []uint16{20004, 20005}, 20004, 20000, nil},
		{"start below range clamps", 20000, 20005, []uint16{20000}, 10, 20001, nil},
		{"start above range clamps", 20000, 20005, nil, 30000, 20000, nil},
		{"single port", 5, 5, nil, 0, 5, nil},
		{"top of uint16", 65534, 65535, []uint16{65534}, 0, 65535, nil},
		{"full", 20000, 20002, []uint16{20000, 20001, 20002}, 20001, 0, errdefs.ErrResourceExhausted},
		{"empty range", 20000, 19999, nil, 0, 0, errdefs.ErrInvalidArgument},
		{"zero min", 0, 10, nil, 0, 0, errdefs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			taken := map[uint16]bool{}
			for _, p := range c.taken {
				taken[p] = true
			}
			got, err := NextFreePort(c.min, c.max, taken, c.start)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %d, %v; want %d", got, err, c.want)
			}
		})
	}
}
