// Package rootfstest builds tiny root filesystems for tests: a static
// busybox with a few applet links, enough to run a sandbox's init and
// simple commands without debootstrapping a distribution.
package rootfstest

import (
	"os"
	"path/filepath"
	"testing"
)

// DefaultApplets are linked to busybox when Busybox is given none.
var DefaultApplets = []string{"sh", "sleep", "cat", "echo", "ls", "hostname", "id"}

// Busybox returns a fresh rootfs directory (under t.TempDir) holding
// /bin/busybox from the host (Debian's busybox-static) and links for the
// applets. It fails the test when busybox-static is not installed.
func Busybox(t testing.TB, applets ...string) string {
	t.Helper()
	if len(applets) == 0 {
		applets = DefaultApplets
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox-static is required (make deps): %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range applets {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
