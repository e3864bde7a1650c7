package preflight

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ParseFilesystems returns the filesystem names of /proc/filesystems.
func ParseFilesystems(s string) []string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 {
			out = append(out, f[len(f)-1])
		}
	}
	return out
}

// ParseProcNet returns the sockets of a /proc/net/{tcp,tcp6,udp,udp6} file
// that accept traffic: TCP sockets in LISTEN, UDP sockets without a peer.
func ParseProcNet(proto, s string) ([]Listener, error) {
	listen := "0A" // TCP_LISTEN
	if strings.HasPrefix(proto, "udp") {
		listen = "07" // TCP_CLOSE: unconnected UDP
	}
	var out []Listener
	for i, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 4 {
			continue // header or blank
		}
		if f[3] != listen {
			continue
		}
		local, err := parseHexAddrPort(f[1])
		if err != nil {
			return nil, fmt.Errorf("/proc/net/%s line %d: %w", proto, i+1, err)
		}
		if strings.HasPrefix(proto, "udp") {
			if remote, err := parseHexAddrPort(f[2]); err != nil || remote.Port() != 0 {
				continue
			}
		}
		out = append(out, Listener{Proto: proto, Addr: local})
	}
	return out, nil
}

// parseHexAddrPort reads "0100007F:0050" (IPv4) or a 32-digit IPv6 address
// in /proc/net's host-order 32-bit words.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	host, port, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", s, errdefs.ErrInvalidArgument)
	}
	p, err := strconv.ParseUint(port, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q: %w", port, errdefs.ErrInvalidArgument)
	}
	raw, err := hex.DecodeString(host)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", host, errdefs.ErrInvalidArgument)
	}
	for w := 0; w < len(raw); w += 4 { // each 32-bit word is little-endian
		raw[w], raw[w+1], raw[w+2], raw[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	a, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(a.Unmap(), uint16(p)), nil
}
