package template

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDebianMirror(t *testing.T) {
	cases := []struct {
		name    string
		list    string
		sources map[string]string
		want    string
	}{
		{name: "nothing", want: defaultMirror},
		{
			name: "one-line with options, security first",
			list: "# comment\ndeb http://security.debian.org/debian-security bookworm-security main\n" +
				"deb-src http://src.example/debian bookworm main\n" +
				"deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main\n",
			want: "http://mirror.example/debian",
		},
		{
			name: "deb822",
			sources: map[string]string{"debian.sources": "Types: deb\n# http://snapshot.debian.org/archive/debian/2025\n" +
				"URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n" +
				"Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n"},
			want: "http://deb.debian.org/debian",
		},
		{
			name: "deb822 disabled and deb-src skipped",
			sources: map[string]string{"a.sources": "Types: deb-src\nURIs: http://src.example/debian\n\n" +
				"Enabled: no\nTypes: deb\nURIs: http://off.example/debian\n\nTypes: deb deb-src\nURIs: https://on.example/debian\n"},
			want: "https://on.example/debian",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if c.list != "" {
				_ = os.WriteFile(filepath.Join(dir, "sources.list"), []byte(c.list), 0o644)
			}
			for n, s := range c.sources {
				_ = os.WriteFile(filepath.Join(dir, "sources.list.d", n), []byte(s), 0o644)
			}
			if got := debianMirror(dir); got != c.want {
				t.Errorf("debianMirror = %q, want %q", got, c.want)
			}
		})
	}
}
