package preflight

import (
	"net/netip"
	"slices"
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

func TestParseProcNet(t *testing.T) {
	got, err := ParseProcNet("tcp", procNetTCP)
	if err != nil {
		t.Fatal(err)
	}
	want := []Listener{
		{"tcp", netip.MustParseAddrPort("127.0.0.1:3000")},
		{"tcp", netip.MustParseAddrPort("0.0.0.0:20100")},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("tcp = %v, want %v", got, want)
	}
	got, err = ParseProcNet("tcp6", procNetTCP6)
	if err != nil || len(got) != 1 || got[0].Addr != netip.MustParseAddrPort("[::1]:8080") {
		t.Fatalf("tcp6 = %v, %v", got, err)
	}
	got, err = ParseProcNet("udp", procNetUDP)
	if err != nil || len(got) != 1 || got[0].Addr != netip.MustParseAddrPort("0.0.0.0:68") {
		t.Fatalf("udp = %v, %v (connected sockets must be skipped)", got, err)
	}
	if _, err := ParseProcNet("tcp", "hdr\n 0: ZZZZ:0050 00000000:0000 0A\n"); err == nil {
		t.Fatal("bad hex accepted")
	}
}

func FuzzParseProcNet(f *testing.F) {
	f.Add("tcp", procNetTCP)
	f.Add("tcp6", procNetTCP6)
	f.Add("udp", procNetUDP)
	f.Fuzz(func(t *testing.T, proto, s string) {
		ls, err := ParseProcNet(proto, s)
		if err != nil && ls != nil {
			t.Fatal("listeners returned with an error")
		}
		for _, l := range ls {
			if !l.Addr.IsValid() {
				t.Fatalf("invalid address from %q", s)
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
