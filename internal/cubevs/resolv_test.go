package cubevs

import (
	"net/netip"
	"strings"
	"testing"
)

func TestSandboxResolvConf(t *testing.T) {
	cases := []struct {
		name           string
		host, upstream string
		want           []string // nameserver/search/options lines, in order
	}{
		{"plain", "nameserver 10.0.0.2\nsearch corp.example\n", "",
			[]string{"search corp.example", "nameserver 10.0.0.2"}},
		{"systemd stub uses upstream", "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch .\n",
			"nameserver 192.0.2.53\nnameserver 198.51.100.53\nsearch lan\n",
			[]string{"search lan", "nameserver 192.0.2.53", "nameserver 198.51.100.53", "options edns0 trust-ad"}},
		{"stub without upstream file keeps nothing", "nameserver 127.0.0.53\n", "", nil},
		{"mixed keeps non-loopback", "nameserver 127.0.0.1\nnameserver 8.8.8.8\n", "nameserver 1.1.1.1\n",
			[]string{"nameserver 8.8.8.8"}},
		{"ipv6 dropped, at most three", "nameserver ::1\nnameserver 2001:db8::1\nnameserver 1.1.1.1\nnameserver 1.0.0.1\nnameserver 8.8.8.8\nnameserver 8.8.4.4\n", "",
			[]string{"nameserver 1.1.1.1", "nameserver 1.0.0.1", "nameserver 8.8.8.8"}},
		{"comments and junk", "# nameserver 9.9.9.9\n; x\nnameserver\nnameserver bogus\nnameserver 9.9.9.9 # trailing\n", "",
			[]string{"nameserver 9.9.9.9"}},
		{"v4-mapped", "nameserver ::ffff:10.1.1.1\n", "", []string{"nameserver 10.1.1.1"}},
		{"empty", "", "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, l := range strings.Split(string(SandboxResolvConf([]byte(c.host), []byte(c.upstream))), "\n") {
				if l != "" && !strings.HasPrefix(l, "#") {
					got = append(got, l)
				}
			}
			if strings.Join(got, "|") != strings.Join(c.want, "|") {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}

func FuzzSandboxResolvConf(f *testing.F) {
	f.Add([]byte("nameserver 127.0.0.53\noptions edns0\n"), []byte("nameserver 10.0.0.2\nsearch a b\n"))
	f.Add([]byte("nameserver 1.1.1.1\nsearch x\n"), []byte(nil))
	f.Fuzz(func(t *testing.T, host, upstream []byte) {
		out := SandboxResolvConf(host, upstream)
		n := 0
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || strings.HasPrefix(l, "#") {
				continue
			}
			switch f[0] {
			case "nameserver":
				n++
				a, err := netip.ParseAddr(f[1])
				if err != nil || !a.Is4() || a.IsLoopback() || len(f) != 2 {
					t.Fatalf("bad nameserver line %q", l)
				}
			case "search", "options":
			default:
				t.Fatalf("unexpected line %q", l)
			}
		}
		if n > maxNameservers {
			t.Fatalf("%d nameservers", n)
		}
	})
}
