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

	buildMu sync.Mutex
	built   = map[string]string{} // version ("" = default) -> cube binary
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("multihost tests need root; skipping")
		os.Exit(0)
	}
	for _, tool := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Printf("multihost tests need %s: %v\n", tool, err)
			os.Exit(1)
		}
	}
	dir, err := os.MkdirTemp("", "cube-mh-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Join(filepath.Dir(file), "..", "..")
	if err := goBuild(filepath.Join(dir, "envd"), "./cmd/envd", "0", ""); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if err := goBuild(filepath.Join(dir, "cube"), "./cmd/cube", "1", ""); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	built[""] = filepath.Join(dir, "cube")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
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
