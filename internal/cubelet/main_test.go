package cubelet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nativebin"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/proctest"
	"github.com/cube-dev/cube/internal/rootfstest"
	"github.com/cube-dev/cube/internal/template"
)

// testBins holds envd and cube-reaper, built on first use by a test that
// runs sandboxes (only root tests do), so that pure unit tests run as any
// user and a run of them alone builds nothing.
var testBins struct {
	once sync.Once
	dir  string
	envd string
	err  error
}

func TestMain(m *testing.M) {
	if code, ok := nsrt.Dispatch(os.Args[1:]); ok {
		os.Exit(code)
	}
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "cubelet-create":
			os.Exit(crashCreateMain(os.Args[2:]))
		case "cubelet-kill":
			os.Exit(crashKillMain(os.Args[2:]))
		case "cubelet-pool":
			os.Exit(crashPoolMain(os.Args[2:]))
		}
	}
	code := m.Run()
	if testBins.dir != "" {
		os.RemoveAll(testBins.dir)
	}
	os.Exit(code)
}

// needRoot skips t unless it runs as root: a node makes network
// namespaces, nftables tables and cgroups.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, nftables tables and cgroups")
	}
}

// envdBinary returns envd built from ./cmd/envd, with cube-reaper next to
// it as `make build` puts it: sandboxes get it as pid 1 (TestReaperIsPID1
// covers the fallback without it). It skips t unless root.
func envdBinary(t testing.TB) string {
	t.Helper()
	needRoot(t)
	testBins.once.Do(func() {
		dir, err := os.MkdirTemp("", "cubelet-envd-")
		if err != nil {
			testBins.err = err
			return
		}
		testBins.dir = dir
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		envd := filepath.Join(dir, "envd")
		build := exec.Command("go", "build", "-o", envd, "./cmd/envd")
		build.Dir = root
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			testBins.err = fmt.Errorf("build ./cmd/envd: %w\n%s", err, out)
			return
		}
		if testBins.err = nativebin.Build(context.Background(), ReaperName, filepath.Join(dir, ReaperName)); testBins.err != nil {
			return
		}
		testBins.envd = envd
	})
	if testBins.err != nil {
		t.Fatal(testBins.err)
	}
	return testBins.envd
}

// node is one test node: its config plus the paths it uses.
type node struct {
	cfg       Config
	templates *template.Registry
}

// newTestNode prepares a node config with names and ranges unique to this
// test, and a busybox template called "tiny".
func newTestNode(t *testing.T) *node {
	t.Helper()
	envd := envdBinary(t)
	tmp := t.TempDir()
	raw := make([]byte, 3)
	rand.Read(raw)
	tag := hex.EncodeToString(raw)
	octet := proctest.FreeOctet(t, 20, 219, func(o int) []netip.Prefix {
		return []netip.Prefix{testNodeCIDR(o), testTransit(o)}
	})
	net := cubevs.DefaultConfig()
	net.RunDir = filepath.Join(tmp, "run")
	net.DPName = "cdp-" + tag
	net.HostVeth = "ct" + tag
	net.TablePrefix = "ct" + tag
	net.NodeCIDR, net.Transit = testNodeCIDR(octet), testTransit(octet)
	// Below the kernel's ephemeral port range (32768+): a DNATed range there
	// would capture other tests' outgoing connections.
	net.PortMin = uint16(30000 + (octet%50)*50)
	net.PortMax = net.PortMin + 49
	n := &node{
		cfg: Config{
			StateDir:     filepath.Join(tmp, "node"),
			Exe:          os.Args[0],
			EnvdPath:     envd,
			EnvdVersion:  "0.0.0-test",
			CgroupParent: "cube-test-" + tag,
			// Pool tests run pre-started slots unless they turn it off.
			PoolPrestart: true,
			PoolTemplate: "tiny",
			Network:      net,
			Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		},
		templates: &template.Registry{Dir: filepath.Join(tmp, "templates"), CacheDir: filepath.Join(tmp, "cache")},
	}
	rootfs := busyboxRootfs(t)
	if _, err := n.templates.ImportDir(context.Background(), "tiny", rootfs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.destroy(t) })
	return n
}

// destroy removes everything the node could have left behind, so a failing
// test does not leak into the next.
func (n *node) destroy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := n.cfg
	cfg.PoolSize = 0 // DestroyNetwork drops existing slots; make no new ones
	c, err := New(ctx, cfg, n.templates)
	if err == nil {
		c.KillAll(ctx)
		c.DestroyNetwork(ctx)
		c.dp.Destroy(ctx)
		c.Close()
	} else {
		t.Logf("cleanup: %v", err)
	}
	for _, cg := range []string{n.cfg.CgroupParent, nsrt.ShimCgroup(n.cfg.CgroupParent)} {
		if err := cgroup.DeleteEverywhere(ctx, cg); err != nil {
			t.Logf("cleanup cgroup %s: %v", cg, err)
		}
	}
}

func busyboxRootfs(t *testing.T) string { return rootfstest.Busybox(t) }

func (n *node) start(t *testing.T) *Cubelet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := New(ctx, n.cfg, n.templates)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testNodeCIDR and testTransit are the subnets of the test node at octet
// (proctest.FreeOctet picks one no host route covers).
func testNodeCIDR(octet int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("172.31.%d.0/24", octet))
}

func testTransit(octet int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("169.254.%d.0/30", octet))
}
