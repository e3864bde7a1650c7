package cubevs

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
)

// The mirror's owner indexes follow every put and forget: a kill asks them
// what to delete instead of listing the kernel.
func TestMirrorIndexesByOwner(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.2")
	m := &nftMirror{}
	m.setPorts([]nftables.SetElement{
		encodeMapping(Mapping{Owner: "a", HostPort: 1, SandboxIP: ip, GuestPort: 80}),
		encodeMapping(Mapping{Owner: "a", HostPort: 2, SandboxIP: ip, GuestPort: 81}),
		encodeMapping(Mapping{Owner: "ab", HostPort: 3, SandboxIP: ip, GuestPort: 80}),
		{Key: []byte{0}}, // undecodable: skipped
	})
	ports := func(owner string) []uint16 {
		p := m.portsOfOwner(owner)
		slices.Sort(p)
		return p
	}
	if got := ports("a"); !slices.Equal(got, []uint16{1, 2}) {
		t.Fatalf("ports of a = %v", got)
	}
	// Port 2 changes hands (a replace after a repair): it leaves a's index.
	m.putPort(Mapping{Owner: "ab", HostPort: 2, SandboxIP: ip, GuestPort: 90})
	if got, got2 := ports("a"), ports("ab"); !slices.Equal(got, []uint16{1}) || !slices.Equal(got2, []uint16{2, 3}) {
		t.Fatalf("after a replace: a %v, ab %v", got, got2)
	}
	m.forgetPort(1)
	m.forgetPort(1) // twice is fine
	if len(m.owned["a"]) != 0 || len(m.ports) != 2 {
		t.Fatalf("after forgetting a's last port: owned %v, ports %v", m.owned, m.ports)
	}
	if _, ok := m.owned["a"]; ok {
		t.Fatal("an owner without ports stays indexed")
	}

	own := string(ifNameKey(LinkName("a")))
	stray := string(ifNameKey("cvelsewhere"))
	m.setVerdicts([]nftables.SetElement{
		{Key: []byte(own), Comment: ""},    // a's link, no comment (written by hand)
		{Key: []byte(stray), Comment: "a"}, // another key naming a
		{Key: ifNameKey(LinkName("ab")), Comment: "ab"},
	})
	keys := m.verdictKeysOf("a")
	slices.Sort(keys)
	want := []string{own, stray}
	slices.Sort(want)
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Fatalf("verdict keys of a = %q, want %q", keys, want)
	}
	for _, k := range keys {
		m.forgetVerdict(k)
	}
	if k := m.verdictKeysOf("a"); len(k) != 0 {
		t.Fatalf("after forgetting: %q", k)
	}
	if k := m.verdictKeysOf("ab"); len(k) != 1 {
		t.Fatalf("ab lost its verdict: %q", k)
	}

	tb := &nftables.Table{Name: "cube"}
	m.setChains("cube", []*nftables.Chain{
		{Name: "sb-a", Table: tb},
		{Name: "forward", Table: tb},
		{Name: "sb-x", Table: &nftables.Table{Name: "other"}},
		{Name: "sb-y"},
	})
	if fmt.Sprint(m.chains) != "map[a:true]" {
		t.Fatalf("chains = %v", m.chains)
	}
}
