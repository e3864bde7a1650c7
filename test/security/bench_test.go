package security

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/cgroup"
	"github.com/cube-dev/cube/internal/nsrt"
)

// BenchmarkStart measures nsrt.Start to ready (and the kill) of a hardened
// busybox sandbox, without and with a size-limited disk, to price the
// disk and the user namespace (the -userns cases; skipped where the kernel
// refuses): `go test ./test/security -run '^$' -bench Start -benchtime 20x`
// (CUBE_BENCH_EXE=bin/cube-shim runs the production binary as shim and
// sandbox-init instead of the test binary).
func BenchmarkStart(b *testing.B) {
	needRoot(b)
	for _, c := range []struct {
		name   string
		diskMB int
		userns bool
	}{{"unlimited", 0, false}, {"unlimited-userns", 0, true}, {"disk1G", 1024, false}, {"disk1G-userns", 1024, true}} {
		b.Run(c.name, func(b *testing.B) {
			base := b.TempDir()
			rootfs := filepath.Join(base, "template")
			buildRootfsB(b, rootfs)
			exe, _ := os.Executable()
			if e := os.Getenv("CUBE_BENCH_EXE"); e != "" {
				exe = e // e.g. bin/cube-shim: the production shim and sandbox-init
			}
			var userns *nsrt.UserNS
			if c.userns {
				if err := nsrt.ProbeUserNS(rootfs, base); err != nil {
					b.Skip(err)
				}
				userns = nsrt.UserNSForSlot(7)
			}
			parent := "cube-secb-" + c.name
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				_ = cgroup.DeleteEverywhere(ctx, nsrt.ShimCgroup(parent))
				_ = cgroup.DeleteEverywhere(ctx, parent)
			}()
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				id := "b" + strconv.Itoa(i)
				stateDir := filepath.Join(base, id)
				if err := os.Mkdir(stateDir, 0o700); err != nil {
					b.Fatal(err)
				}
				sb, err := nsrt.Start(ctx, exe, nsrt.Spec{
					ID: id, StateDir: stateDir, Rootfs: rootfs, Args: []string{"/bin/sh", "-c", "echo x >&3; exec sleep 1000"},
					Env: []string{"PATH=/bin"}, Resources: cgroup.Resources{PidsMax: 16, MemoryMB: 64},
					CgroupParent: parent, DiskSizeMB: c.diskMB, UserNS: userns,
				})
				if err != nil {
					b.Fatal(err)
				}
				sb.Close()
				b.StopTimer()
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				if err := nsrt.Cleanup(cctx, stateDir, parent, id); err != nil {
					b.Error(err)
				}
				cancel()
				b.StartTimer()
			}
		})
	}
}

func buildRootfsB(b *testing.B, dir string) {
	b.Helper()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		b.Skip("needs /bin/busybox")
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), bb, 0o755); err != nil {
		b.Fatal(err)
	}
	for _, a := range []string{"sh", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSyscallLoop runs `probe loop` in a hardened sandbox and reports
// the ns per call of a few syscalls under the sandbox's seccomp filter (see
// probe's loop). With CUBE_BENCH_EXE pointing at another build's cube-shim
// (e.g. the previous commit's, see seccomp-bench.sh) it measures that
// build's filter: `go test ./test/security -run '^$' -bench SyscallLoop`.
func BenchmarkSyscallLoop(b *testing.B) {
	needRoot(b)
	base := b.TempDir()
	rootfs := filepath.Join(base, "template")
	buildRootfsB(b, rootfs)
	shared := filepath.Join(base, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		b.Fatal(err)
	}
	exe, _ := os.Executable()
	if e := os.Getenv("CUBE_BENCH_EXE"); e != "" {
		exe = e
	}
	parent := "cube-secb-loop"
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = cgroup.DeleteEverywhere(ctx, nsrt.ShimCgroup(parent))
		_ = cgroup.DeleteEverywhere(ctx, parent)
	}()
	const rounds = 200000
	sums := map[string]float64{}
	for i := 0; b.Loop(); i++ {
		id := "l" + strconv.Itoa(i)
		stateDir := filepath.Join(base, id)
		if err := os.Mkdir(stateDir, 0o700); err != nil {
			b.Fatal(err)
		}
		out := filepath.Join(shared, id)
		sb, err := nsrt.Start(context.Background(), exe, nsrt.Spec{
			ID: id, StateDir: stateDir, Rootfs: rootfs,
			Args: []string{"/bin/sh", "-c", "echo x >&3; /bin/probe loop " + strconv.Itoa(rounds) + " > /shared/" + id + ".tmp; mv /shared/" + id + ".tmp /shared/" + id + "; exec sleep 1000"},
			Env:  []string{"PATH=/bin"}, Resources: cgroup.Resources{PidsMax: 64, MemoryMB: 128},
			Binds:        []nsrt.Bind{{Source: probeBinary(b), Target: "/bin/probe", ReadOnly: true}, {Source: shared, Target: "/shared"}},
			CgroupParent: parent,
		})
		if err != nil {
			b.Fatal(err)
		}
		var text []byte
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if text, err = os.ReadFile(out); err == nil {
				break
			}
		}
		sb.Close()
		cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := nsrt.Cleanup(cctx, stateDir, parent, id); err != nil {
			b.Error(err)
		}
		cancel()
		if text == nil {
			b.Fatal("probe loop wrote nothing")
		}
		for k, v := range results(string(text)) {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatalf("probe loop: %s=%s", k, v)
			}
			sums[k] += n
		}
	}
	for k, v := range sums {
		b.ReportMetric(v/float64(b.N), k+"-ns/call")
	}
}
