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
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// bins holds the binaries, built on first use by needBins, and hostNS a pin
// of the test's own (host) network namespace. Tests cannot name it by
// /proc/<pid>/ns/net: that follows the main thread, which the Go runtime may
// lend to a goroutine that is locked into a Pod netns.
var bins struct {
	once                    sync.Once
	err                     error
	dir, cube, envd, hostNS string
}

// TestMain pins the host netns before any test can switch a thread (root
// only: a bind mount); as another user every test skips in needBins.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		dir, err := os.MkdirTemp("", "cube-it-bin-")
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		bins.dir = dir
		bins.hostNS = filepath.Join(dir, "hostns")
		if err := pinHostNS(bins.hostNS); err != nil {
			fmt.Printf("pin host netns: %v\n", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	if os.Getenv("CUBE_CACHE_DIR") == "" {
		os.Setenv("CUBE_CACHE_DIR", "/var/cache/cube")
	}
	code := m.Run()
	if bins.dir != "" {
		unpinNS(bins.hostNS)
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// needBins skips t unless it runs as root with /bin/sh, and builds cube and
// envd from this tree on first use.
func needBins(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs cube, which creates namespaces, nftables tables and cgroups")
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skipf("needs /bin/sh: %v", err)
	}
	bins.once.Do(func() {
		bins.cube = filepath.Join(bins.dir, "cube")
		bins.envd = filepath.Join(bins.dir, "envd")
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
				bins.err = fmt.Errorf("build %s: %w\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
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
