package cubevs

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (netns, veth, nftables)")
	}
}

func randU32(t testing.TB) uint32 {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return binary.BigEndian.Uint32(b[:])
}

// testConfig returns a Config whose names, transit subnet and port range
// are unique to this test, so tests can run next to other dataplanes.
func testConfig(t testing.TB) Config {
	t.Helper()
	r := randU32(t)
	tag := fmt.Sprintf("%06x", r&0xffffff)
	// 30000-32699: below the kernel's ephemeral ports, so the host DNAT of
	// this range never captures another test's outgoing connections.
	base := uint16(30000 + (r>>8)%27*100)
	return Config{
		RunDir:      t.TempDir(),
		DPName:      "dp-" + tag,
		HostVeth:    "cvt" + tag,
		NodeCIDR:    netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 31, byte(r >> 4), 0}), 24),
		Transit:     netip.PrefixFrom(netip.AddrFrom4([4]byte{169, 254, byte(200 + (r>>12)%50), byte(r>>20) &^ 3}), 30),
		PortMin:     base,
		PortMax:     base + 99,
		TablePrefix: "cubet" + tag,
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openDP opens a dataplane and registers Destroy plus a check that nothing
// of it is left on the host.
func openDP(t testing.TB, cfg Config) *Dataplane {
	t.Helper()
	t.Cleanup(func() { assertNothingLeft(t, cfg) })
	d, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		// Re-open so the cleanup works whichever handle the test ended with.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		d.Close()
		last, err := Open(ctx, cfg)
		if err != nil {
			t.Errorf("cleanup Open: %v", err)
			return
		}
		if err := last.Destroy(ctx); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return d
}

// assertNothingLeft fails the test if the host still holds a link, table or
// pin of cfg, and removes what it finds.
func assertNothingLeft(t testing.TB, cfg Config) {
	t.Helper()
	if l, err := netlink.LinkByName(cfg.HostVeth); err == nil {
		t.Errorf("host link %s left behind", cfg.HostVeth)
		_ = netlink.LinkDel(l)
	}
	if c, err := nftables.New(); err == nil {
		tables, _ := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
		for _, tb := range tables {
			if tb.Name == cfg.TablePrefix {
				t.Errorf("host nftables table %s left behind", tb.Name)
				c.DelTable(tb)
				_ = c.Flush()
			}
		}
	}
	entries, _ := os.ReadDir(cfg.netnsDir())
	for _, e := range entries {
		p := filepath.Join(cfg.netnsDir(), e.Name())
		t.Errorf("netns pin %s left behind", p)
		_ = unpinNetNS(p)
	}
}

// inNS runs fn inside the network namespace pinned at path.
func inNS(t *testing.T, path string, fn func() error) error {
	t.Helper()
	h, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer h.Close()
	return inNetNS(h, fn)
}

// serveTag listens on addr inside the netns at nsPath and answers every
// line with "<tag>:<line>". The listener is closed at cleanup.
func serveTag(t *testing.T, nsPath, addr, tag string) net.Addr {
	t.Helper()
	var ln net.Listener
	listen := func() (err error) { ln, err = net.Listen("tcp4", addr); return err }
	var err error
	if nsPath == "" {
		err = listen()
	} else {
		err = inNS(t, nsPath, listen)
	}
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, nsPath, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					fmt.Fprintf(c, "%s:%s", tag, line)
				}
			}()
		}
	}()
	return ln.Addr()
}

// talk dials addr (from nsPath, or the host when empty), sends "ping" and
// returns the answer.
func talk(t *testing.T, nsPath, addr string, timeout time.Duration) (string, error) {
	t.Helper()
	var c net.Conn
	dial := func() (err error) { c, err = net.DialTimeout("tcp4", addr, timeout); return err }
	var err error
	if nsPath == "" {
		err = dial()
	} else {
		err = inNS(t, nsPath, dial)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout + 2*time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

func mustTalk(t *testing.T, nsPath, addr, want string) {
	t.Helper()
	got, err := talk(t, nsPath, addr, 3*time.Second)
	if err != nil {
		t.Fatalf("talk %s from %q: %v", addr, nsPath, err)
	}
	if got != want+":ping" {
		t.Fatalf("talk %s from %q = %q, want %q", addr, nsPath, got, want+":ping")
	}
}

func mustNotTalk(t *testing.T, nsPath, addr string) {
	t.Helper()
	got, err := talk(t, nsPath, addr, 700*time.Millisecond)
	if err == nil {
		t.Fatalf("talk %s from %q succeeded (%q), want denied", addr, nsPath, got)
	}
}
