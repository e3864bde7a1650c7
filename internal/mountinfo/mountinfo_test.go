package mountinfo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain":              "/plain",
		`/a\040b`:             "/a b",
		`/tab\011nl\012`:      "/tab\tnl\n",
		`/back\134slash`:      `/back\slash`,
		`/not\0a\999escape\0`: `/not\0a\999escape\0`,
		`/end\04`:             `/end\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// The kernel's own escaping, read back: a tmpfs mounted on a directory whose
// name has a space and a backslash is found under its real name.
func TestUnescapeRealMountinfo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	dir := filepath.Join(t.TempDir(), `a b\c`)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cube-mountinfo-test", dir, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && Unescape(f[4]) == dir {
			return
		}
	}
	t.Fatalf("no mountinfo line unescapes to %q", dir)
}
