package template

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a goroutine-safe progress sink.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestEnsureBase builds `base` for real. The first run on a machine takes
// ~2-3 minutes (debootstrap); later runs use the shared cache dir
// ($CUBE_CACHE_DIR or /var/cache/cube) and take seconds.
func TestEnsureBase(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Debian rootfs; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (debootstrap)")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Skip("debootstrap not installed (make deps)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()

	r := &Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: DefaultCacheDir()}
	var progress lockedBuffer
	start := time.Now()
	tpl, err := r.EnsureBase(ctx, &progress)
	if err != nil {
		t.Fatalf("EnsureBase: %v\nprogress tail:\n%s", err, tail(progress.String(), 30))
	}
	t.Logf("first EnsureBase took %s (source %s)", time.Since(start).Round(time.Millisecond), tpl.Source)
	if tpl.Name != BaseName || tpl.CPUCount != 2 || tpl.MemoryMB != 512 || tpl.DiskSizeMB != 1024 {
		t.Errorf("unexpected metadata: %+v", tpl)
	}
	if !strings.HasPrefix(tpl.Digest, "sha256:") || !strings.HasPrefix(tpl.Source, "debootstrap:bookworm") {
		t.Errorf("digest %q source %q", tpl.Digest, tpl.Source)
	}
	if progress.String() == "" {
		t.Error("no progress written")
	}
	for _, p := range []string{"usr/bin/python3", "usr/bin/bash", "usr/bin/ps", "etc/ssl/certs/ca-certificates.crt", ".cube", "home/user"} {
		if _, err := os.Stat(filepath.Join(tpl.RootfsPath, p)); err != nil {
			t.Errorf("rootfs lacks %s: %v", p, err)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(tpl.RootfsPath, "etc/passwd"))
	if !strings.Contains(string(passwd), "user:x:1000:1000::/home/user:/bin/bash") {
		t.Errorf("passwd lacks user:\n%s", passwd)
	}
	lists, _ := filepath.Glob(filepath.Join(tpl.RootfsPath, "var/lib/apt/lists/*_Packages"))
	debs, _ := filepath.Glob(filepath.Join(tpl.RootfsPath, "var/cache/apt/archives/*.deb"))
	if len(lists)+len(debs) > 0 {
		t.Errorf("apt caches not cleaned: %v %v", lists, debs)
	}
	cacheFile := filepath.Join(r.cacheDir(), DefaultBaseSpec().CacheKey()+".tar")
	if _, err := os.Stat(cacheFile); err != nil {
		t.Errorf("cache file missing: %v", err)
	}

	// The installed python actually runs inside the rootfs.
	out, err := exec.CommandContext(ctx, "chroot", tpl.RootfsPath, "/usr/bin/python3", "-c", "print(6*7)").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "42" {
		t.Errorf("python3 in rootfs: %v: %s", err, out)
	}

	// Second call (a restart): present, returned as is; the staging dir of
	// a build a crash interrupted is swept all the same.
	stale := filepath.Join(r.Dir, ".tmp-crashed-0123456789abcdef")
	if err := os.MkdirAll(filepath.Join(stale, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	again, err := r.EnsureBase(ctx, nil)
	if err != nil || again.Digest != tpl.Digest || !again.CreatedAt.Equal(tpl.CreatedAt) {
		t.Errorf("second EnsureBase = %+v, %v; want the same template", again, err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("staging dir of an interrupted build still there after EnsureBase with base present: %v", err)
	}

	// Another data dir gets base from the cache quickly, with the same content.
	r2 := &Registry{Dir: filepath.Join(t.TempDir(), "templates"), CacheDir: r.CacheDir}
	var progress2 lockedBuffer
	start = time.Now()
	tpl2, err := r2.EnsureBase(ctx, &progress2)
	if err != nil {
		t.Fatalf("EnsureBase from cache: %v\n%s", err, progress2.String())
	}
	took := time.Since(start)
	t.Logf("cached EnsureBase took %s", took.Round(time.Millisecond))
	if !strings.Contains(progress2.String(), "using cached") {
		t.Errorf("cache not used: %s", progress2.String())
	}
	if took > 90*time.Second {
		t.Errorf("cached build took %s", took)
	}
	if tpl2.Digest != tpl.Digest {
		t.Errorf("digest from cache %s != %s", tpl2.Digest, tpl.Digest)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
