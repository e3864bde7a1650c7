package preflight

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const procNetTCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 00000000:4E84 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:0BB8 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
`

const procNetTCP6 = `  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000
`

const procNetUDP = `   sl  local_address rem_address   st
  1: 00000000:0044 00000000:0000 07 00000000:00000000
  2: 0100007F:9C41 0100007F:0035 01 00000000:00000000
`

// accepting is what Gather records of a table: the sockets that accept
// traffic from anyone.
func accepting(t *testing.T, proto, table string) []Listener {
	t.Helper()
	socks, err := ParseProcNet(proto, table)
	if err != nil {
		t.Fatalf("%s: %v", proto, err)
	}
	var out []Listener
	for _, s := range socks {
		if s.Accepting() {
			out = append(out, Listener{s.Proto, s.Local})
		}
	}
	return out
}

func TestParseProcNet(t *testing.T) {
	want := []Listener{
		{"tcp", netip.MustParseAddrPort("127.0.0.1:3000")},
		{"tcp", netip.MustParseAddrPort("0.0.0.0:20100")},
	}
	if got := accepting(t, "tcp", procNetTCP); !slices.Equal(got, want) {
		t.Fatalf("tcp = %v, want %v", got, want)
	}
	if got := accepting(t, "tcp6", procNetTCP6); len(got) != 1 || got[0].Addr != netip.MustParseAddrPort("[::1]:8080") {
		t.Fatalf("tcp6 = %v", got)
	}
	if got := accepting(t, "udp", procNetUDP); len(got) != 1 || got[0].Addr != netip.MustParseAddrPort("0.0.0.0:68") {
		t.Fatalf("udp = %v (connected sockets do not accept traffic from anyone)", got)
	}
	// Every line is returned, with its peer and state.
	socks, err := ParseProcNet("tcp", procNetTCP)
	if err != nil || len(socks) != 3 {
		t.Fatalf("tcp sockets = %v, %v; want all 3", socks, err)
	}
	if s := socks[2]; s.State != "01" || s.Remote != netip.MustParseAddrPort("127.0.0.1:54000") || s.Accepting() || s.HoldsPort() {
		t.Errorf("established socket = %+v (accepting %v, holds port %v)", s, s.Accepting(), s.HoldsPort())
	}
	if _, err := ParseProcNet("tcp", "hdr\n 0: ZZZZ:0050 00000000:0000 0A\n"); err == nil {
		t.Fatal("bad hex accepted")
	}
	if _, err := ParseProcNet("udp", "hdr\n 0: 00000000:0050 00000000 07\n"); err == nil {
		t.Fatal("peer without a port accepted")
	}
}

// TestHoldsPort: the node's port-range check counts TCP listeners and every
// UDP socket, connected or not: DNAT of the range would take its traffic.
func TestHoldsPort(t *testing.T) {
	var held []uint16
	for _, tc := range []struct{ proto, table string }{{"tcp", procNetTCP}, {"udp", procNetUDP}} {
		socks, err := ParseProcNet(tc.proto, tc.table)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range socks {
			if s.HoldsPort() {
				held = append(held, s.Local.Port())
			}
		}
	}
	if want := []uint16{3000, 20100, 68, 40001}; !slices.Equal(held, want) {
		t.Errorf("ports held %v, want %v", held, want)
	}
}

func TestReadProcNet(t *testing.T) {
	dir := t.TempDir()
	for name, table := range map[string]string{"tcp": procNetTCP, "udp": procNetUDP, "udp6": "hdr\n 0: nonsense 00000000:0000 07\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// tcp6 is missing (IPv6 disabled): skipped. udp6 is garbage: its error
	// comes back with the sockets of the readable tables.
	socks, err := ReadProcNet(dir)
	if err == nil || !strings.Contains(err.Error(), "/proc/net/udp6 line 2") {
		t.Errorf("error %v, want the udp6 parse error", err)
	}
	if len(socks) != 5 {
		t.Errorf("%d sockets, want the 3 of tcp and 2 of udp: %v", len(socks), socks)
	}
	if err := os.Remove(filepath.Join(dir, "tcp")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadProcNet(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing tcp table: %v, want ErrNotExist", err)
	}
}

func FuzzParseProcNet(f *testing.F) {
	f.Add("tcp", procNetTCP)
	f.Add("tcp6", procNetTCP6)
	f.Add("udp", procNetUDP)
	f.Fuzz(func(t *testing.T, proto, s string) {
		socks, err := ParseProcNet(proto, s)
		if err != nil && socks != nil {
			t.Fatal("sockets returned with an error")
		}
		for _, sock := range socks {
			if !sock.Local.IsValid() || !sock.Remote.IsValid() {
				t.Fatalf("invalid address %+v from %q", sock, s)
			}
		}
	})
}

func TestParseFilesystemsAndCNITypes(t *testing.T) {
	fs := ParseFilesystems("nodev\tsysfs\n\text4\nnodev\toverlay\n")
	if !slices.Equal(fs, []string{"sysfs", "ext4", "overlay"}) {
		t.Fatalf("filesystems = %v", fs)
	}
	if got := CNITypes([]byte(`{"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"calico"},{"type":"portmap"}]}`)); !slices.Equal(got, []string{"calico", "portmap"}) {
		t.Fatalf("conflist types = %v", got)
	}
	if got := CNITypes([]byte(`{"type":"flannel"}`)); !slices.Equal(got, []string{"flannel"}) {
		t.Fatalf("conf types = %v", got)
	}
	if got := CNITypes([]byte(`not json`)); got != nil {
		t.Fatalf("garbage types = %v", got)
	}
}
