// Package multihost_test runs Cube's cluster mode as several hosts would:
// a server (two for PostgreSQL HA) and three cubelets, each in a network
// namespace of its own with its own address on a bridge the test creates.
// Every cubelet uses the default dataplane names (cube0, table cube, ports
// 20000-29999) because its netns is its "host"; data dirs, run dirs and
// cgroup parents differ because the filesystem and cgroups are shared.
package multihost_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	binDir   string
	repoRoot string

	buildMu  sync.Mutex
	built    = map[string]string{} // version ("" = default) -> cube binary
	buildErr error                 // of the first build, kept for every later test
)

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Join(filepath.Dir(file), "..", "..")
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// needBins skips t unless it runs as root with ip and nsenter, and builds
// envd and the default cube binary into binDir on first use.
func needBins(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, a bridge, nftables tables and cgroups")
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("multihost tests need %s: %v", tool, err)
		}
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if binDir == "" && buildErr == nil {
		buildErr = buildDefault()
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

func buildDefault() error {
	dir, err := os.MkdirTemp("", "cube-mh-bin-")
	if err != nil {
		return err
	}
	if err := goBuild(filepath.Join(dir, "envd"), "./cmd/envd", "0", ""); err != nil {
		os.RemoveAll(dir)
		return err
	}
	if err := goBuild(filepath.Join(dir, "cube"), "./cmd/cube", "1", ""); err != nil {
		os.RemoveAll(dir)
		return err
	}
	binDir = dir
	built[""] = filepath.Join(dir, "cube")
	return nil
}

func goBuild(out, pkg, cgo, version string) error {
	args := []string{"build", "-o", out}
	if version != "" {
		args = append(args, "-ldflags", "-X github.com/cube-dev/cube/internal/version.Version="+version)
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s (version %q): %v\n%s", pkg, version, err, b)
	}
	return nil
}

// cubeBinary returns a cube binary linked with the given version ("" = the
// build's default), building it on first use. It lives next to envd, so
// cubelets find envd without --envd too.
func cubeBinary(t *testing.T, version string) string {
	t.Helper()
	needBins(t)
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[version]; ok {
		return p
	}
	p := filepath.Join(binDir, "cube-"+version)
	if err := goBuild(p, "./cmd/cube", "1", version); err != nil {
		t.Fatal(err)
	}
	built[version] = p
	return p
}
