package template

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEnsureInterp builds code-interpreter-v1 for real: base's debootstrap
// plus the kernel and libraries (first run on a machine: ~5-10 minutes;
// later runs extract the cache in $CUBE_CACHE_DIR or /var/cache/cube).
func TestEnsureInterp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Debian rootfs; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (debootstrap)")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Skip("debootstrap not installed (make deps)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	r := &Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: DefaultCacheDir()}
	var progress lockedBuffer
	start := time.Now()
	tpl, err := r.EnsureInterp(ctx, &progress)
	if err != nil {
		t.Fatalf("EnsureInterp: %v\nprogress tail:\n%s", err, tail(progress.String(), 30))
	}
	t.Logf("EnsureInterp took %s (source %s)", time.Since(start).Round(time.Millisecond), tpl.Source)
	if tpl.Name != InterpName || !strings.HasPrefix(tpl.Digest, "sha256:") {
		t.Errorf("template %+v", tpl)
	}
	if !HasInterp(tpl.RootfsPath) {
		t.Error("no code-interpreter marker")
	}
	if _, err := os.Stat(filepath.Join(tpl.RootfsPath, "usr/share/jupyter/kernels/python3/kernel.json")); err != nil {
		t.Errorf("no python kernelspec: %v", err)
	}
	out, err := exec.CommandContext(ctx, "chroot", tpl.RootfsPath, "/usr/bin/python3", "-c",
		"import ipykernel, numpy, pandas, matplotlib, requests; print('ok')").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Errorf("libraries in rootfs: %v: %s", err, out)
	}
	if again, err := r.EnsureInterp(ctx, nil); err != nil || again.Digest != tpl.Digest {
		t.Errorf("second EnsureInterp = %+v, %v", again, err)
	}
	var size int64
	_ = filepath.Walk(tpl.RootfsPath, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			size += fi.Size()
		}
		return nil
	})
	t.Logf("rootfs size %d MiB", size>>20)
}
