package preflight

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
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

// Socket is one line of a /proc/net/{tcp,tcp6,udp,udp6} table.
type Socket struct {
	Proto  string // tcp, tcp6, udp, udp6
	Local  netip.AddrPort
	Remote netip.AddrPort
	State  string // the kernel's hex state: "0A" TCP_LISTEN, "07" TCP_CLOSE (a UDP socket without a peer)
}

// Accepting reports whether s accepts traffic from anyone: a TCP socket in
// LISTEN or a UDP socket without a peer.
func (s Socket) Accepting() bool {
	if s.udp() {
		return s.State == "07" && s.Remote.Port() == 0
	}
	return s.State == "0A"
}

// HoldsPort reports whether traffic to s's local port reaches s: a TCP
// socket in LISTEN or any UDP socket (a connected one hears its peer).
func (s Socket) HoldsPort() bool { return s.udp() || s.State == "0A" }

func (s Socket) udp() bool { return strings.HasPrefix(s.Proto, "udp") }

// ParseProcNet returns the sockets of a /proc/net/{tcp,tcp6,udp,udp6} file.
func ParseProcNet(proto, s string) ([]Socket, error) {
	var out []Socket
	for i, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 4 {
			continue // header or blank
		}
		local, err := parseHexAddrPort(f[1])
		if err != nil {
			return nil, fmt.Errorf("/proc/net/%s line %d: %w", proto, i+1, err)
		}
		remote, err := parseHexAddrPort(f[2])
		if err != nil {
			return nil, fmt.Errorf("/proc/net/%s line %d: %w", proto, i+1, err)
		}
		out = append(out, Socket{Proto: proto, Local: local, Remote: remote, State: f[3]})
	}
	return out, nil
}

// ReadProcNet reads the tcp, tcp6, udp and udp6 tables of netDir (a
// /proc/<pid>/net or /proc/thread-self/net: the tables of that process's or
// thread's network namespace). Missing IPv6 tables (IPv6 disabled) are
// skipped; the sockets of the tables that could be read are returned with
// the errors of the others.
func ReadProcNet(netDir string) ([]Socket, error) {
	var out []Socket
	var errs []error
	for _, proto := range []string{"tcp", "tcp6", "udp", "udp6"} {
		b, err := os.ReadFile(filepath.Join(netDir, proto))
		if errors.Is(err, fs.ErrNotExist) && strings.HasSuffix(proto, "6") {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		socks, err := ParseProcNet(proto, string(b))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, socks...)
	}
	return out, errors.Join(errs...)
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
