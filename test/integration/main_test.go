// Package integration drives real `cube up` processes (built from this
// tree) through restarts, crashes, upgrades and network-namespace loss, and
// asserts that sandboxes outlive the agent (issue 3). It needs root.
package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// bins holds the binaries built once per run, and hostNS a pin of the
// test's own (host) network namespace. Tests cannot name it by
// /proc/<pid>/ns/net: that follows the main thread, which the Go runtime may
// lend to a goroutine that is locked into a Pod netns.
var bins struct {
	dir, cube, envd, hostNS string
}

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("integration tests need root (namespaces, nftables, cgroups); skipping")
		os.Exit(0)
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		fmt.Println("no /bin/sh; skipping")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "cube-it-bin-")
	if err != nil {
		panic(err)
	}
	bins.dir = dir
	bins.hostNS = filepath.Join(dir, "hostns")
	if err := pinHostNS(bins.hostNS); err != nil {
		fmt.Printf("pin host netns: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	bins.cube = filepath.Join(dir, "cube")
	bins.envd = filepath.Join(dir, "envd")
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{
		{bins.cube, "./cmd/cube", nil},
		{bins.envd, "./cmd/envd", []string{"CGO_ENABLED=0"}},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Printf("build %s: %v\n%s", b.pkg, err, out)
			unpinNS(bins.hostNS)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	if os.Getenv("CUBE_CACHE_DIR") == "" {
		os.Setenv("CUBE_CACHE_DIR", "/var/cache/cube")
	}
	code := m.Run()
	unpinNS(bins.hostNS)
	os.RemoveAll(dir)
	os.Exit(code)
}

// pinHostNS bind-mounts this thread's network namespace (the host's: no
// test has switched any thread yet) onto path.
func pinHostNS(path string) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		return err
	}
	return unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
}
