package cubelet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/cubevs"
	"github.com/cube-dev/cube/internal/nsrt"
	"github.com/cube-dev/cube/internal/template"
)

// BenchmarkRestartToServing measures what a restarted cubelet costs before
// it serves: New (open store and dataplane) plus Reconcile over N live
// sandboxes (re-dial every shim, re-apply egress, check mappings).
// CUBE_BENCH_SIZES overrides the sizes (default "0,100,500").
//
//	go test -run '^$' -bench RestartToServing -benchtime 5x ./internal/cubelet
func BenchmarkRestartToServing(b *testing.B) {
	sizes := []int{0, 100, 500}
	if v := os.Getenv("CUBE_BENCH_SIZES"); v != "" {
		sizes = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				b.Fatalf("CUBE_BENCH_SIZES: %v", err)
			}
			sizes = append(sizes, n)
		}
	}
	for _, size := range sizes {
		b.Run(fmt.Sprintf("sandboxes=%d", size), func(b *testing.B) {
			cfg, templates := benchNode(b)
			ctx := context.Background()
			c, err := New(ctx, cfg, templates)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if err := createMany(ctx, c, size); err != nil {
				c.Close()
				b.Fatal(err)
			}
			b.Logf("created %d sandboxes in %s; their memory: %d MiB, their tasks (threads, shims included): %d",
				size, time.Since(start).Round(time.Millisecond), cgroupMemMiB(cfg.CgroupParent), cgroupTasks(cfg.CgroupParent))
			c.Close()
			for b.Loop() {
				c, err := New(ctx, cfg, templates)
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			b.ReportMetric(float64(cgroupMemMiB(cfg.CgroupParent)), "sandbox-MiB")
		})
	}
}

func createMany(ctx context.Context, c *Cubelet, n int) error {
	var wg sync.WaitGroup
	errc := make(chan error, n)
	sem := make(chan struct{}, 4)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := c.CreateSandbox(ctx, createReq(fmt.Sprintf("bench-%04d", i))); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// cgroupMemMiB is the memory charged to the sandboxes and their shims
// (cgroup v1 memory controller; 0 where it cannot be read).
func cgroupMemMiB(parent string) int64 {
	var total int64
	for _, cg := range []string{parent, nsrt.ShimCgroup(parent)} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.usage_in_bytes"))
		if err != nil {
			continue
		}
		v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		total += v
	}
	return total >> 20
}

// cgroupTasks counts the threads of the sandboxes and their shims (cgroup
// v1 pids controller; 0 where it cannot be read): what pid_max bounds.
func cgroupTasks(parent string) int {
	n := 0
	for _, cg := range []string{parent, nsrt.ShimCgroup(parent)} {
		_ = filepath.WalkDir(filepath.Join("/sys/fs/cgroup/pids", cg), func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Name() == "tasks" {
				b, _ := os.ReadFile(p)
				n += strings.Count(string(b), "\n")
			}
			return nil
		})
	}
	return n
}

// benchNode is newTestNode sized for hundreds of sandboxes: a /22 and a
// 1000-port range, names unique to the run, torn down at the end.
// CUBE_BENCH_BIN=DIR starts sandboxes from the binaries `make build
// BIN=DIR` put there instead of this test binary; CUBE_BENCH_LOG=debug
// logs each create's step times.
func benchNode(b *testing.B) (Config, *template.Registry) {
	tmp, err := os.MkdirTemp("", "cbench-")
	if err != nil {
		b.Fatal(err)
	}
	raw := make([]byte, 3)
	rand.Read(raw)
	tag := hex.EncodeToString(raw)
	octet := int(raw[0]) % 60 * 4
	net := cubevs.DefaultConfig()
	net.RunDir = filepath.Join(tmp, "run")
	net.DPName = "cdp-" + tag
	net.HostVeth = "cb" + tag
	net.TablePrefix = "cb" + tag
	net.NodeCIDR = netip.MustParsePrefix(fmt.Sprintf("172.27.%d.0/22", octet))
	net.Transit = netip.MustParsePrefix(fmt.Sprintf("169.254.%d.12/30", octet))
	net.PortMin, net.PortMax = 42000, 42999
	exe, envd := os.Args[0], ""
	if dir := os.Getenv("CUBE_BENCH_BIN"); dir != "" {
		// Binaries as `make build BIN=dir` installs them: sandboxes start
		// from cube-shim (cube-supervisor, envd and cube-reaper next to it)
		// as on a node, not from this test binary.
		needRoot(b)
		exe, envd = filepath.Join(dir, ShimName), filepath.Join(dir, "envd")
	} else {
		envd = envdBinary(b)
	}
	cfg := Config{
		StateDir: filepath.Join(tmp, "node"), Exe: exe, EnvdPath: envd, EnvdVersion: "0.0.0-bench",
		CgroupParent: "cube-bench-" + tag, Network: net,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: benchLogLevel()})),
	}
	templates := &template.Registry{Dir: filepath.Join(tmp, "templates"), CacheDir: filepath.Join(tmp, "cache")}
	rootfs := filepath.Join(tmp, "rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "root"} {
		os.MkdirAll(filepath.Join(rootfs, d), 0o755)
	}
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		b.Skipf("busybox-static not installed: %v", err)
	}
	os.WriteFile(filepath.Join(rootfs, "bin/busybox"), data, 0o755)
	os.Symlink("busybox", filepath.Join(rootfs, "bin/sh"))
	if _, err := templates.ImportDir(context.Background(), "tiny", rootfs); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if c, err := New(ctx, cfg, templates); err == nil {
			if err := c.KillAll(ctx); err != nil {
				b.Errorf("cleanup: %v", err)
			}
			c.dp.Destroy(ctx)
			c.Close()
		} else {
			b.Errorf("cleanup: %v", err)
		}
		for _, cg := range []string{cfg.CgroupParent, nsrt.ShimCgroup(cfg.CgroupParent)} {
			if err := cgroup.DeleteEverywhere(ctx, cg); err != nil {
				b.Errorf("cleanup cgroup %s: %v", cg, err)
			}
		}
		os.RemoveAll(tmp)
	})
	return cfg, templates
}

// benchLogLevel is the benchmarks' log level: warn, or debug with
// CUBE_BENCH_LOG=debug (each create then logs its step times, "sandbox
// create steps").
func benchLogLevel() slog.Level {
	if os.Getenv("CUBE_BENCH_LOG") == "debug" {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
