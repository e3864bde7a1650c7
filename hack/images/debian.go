package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/cube-dev/cube/internal/template"
)

// Debian makes the Debian base layers of the images without a container
// engine: `debootstrap --variant=minbase` from the machine's apt mirror is
// what `FROM debian:bookworm-slim` gives the Dockerfiles, and the same with
// --include=<packages> is their `apt-get install --no-install-recommends`.
// An image gets the minbase tree as its first layer (shared by all images)
// and, when it lists packages, the difference to minbase as its second.
//
// Every debootstrap result is cached as a normalised tar under CacheDir
// (fixed file times, no logs, caches or host files) and every layer as a
// gzipped blob, so a warm build reads files and the same cache gives the same
// digests. A cached tree older than MaxAge is rebuilt, which picks up
// Debian's updates.
type Debian struct {
	Suite    string
	Arch     string // Debian architecture name
	Mirror   string // written into the images' /etc/apt/sources.list too
	CacheDir string
	MaxAge   time.Duration // 0: never rebuild a cached tree
	Log      io.Writer

	layers map[string]v1.Layer // by cache file, so images share layer objects
}

// NewDebian returns the bookworm builder for this machine's architecture
// and apt mirror (the one internal/template debootstraps `base` from),
// caching under cacheDir.
func NewDebian(cacheDir string) *Debian {
	return &Debian{
		Suite:    "bookworm",
		Arch:     template.DefaultBaseSpec().Arch,
		Mirror:   template.DebianMirror(),
		CacheDir: cacheDir,
		MaxAge:   7 * 24 * time.Hour,
		Log:      os.Stderr,
	}
}

// Layers returns the base layers of an image with packages installed:
// [minbase] without packages, else [minbase, packages over minbase].
func (d *Debian) Layers(ctx context.Context, packages []string) ([]v1.Layer, error) {
	if err := os.MkdirAll(d.CacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("debian cache: %w", err)
	}
	minbase, err := d.rootTar(ctx, nil)
	if err != nil {
		return nil, err
	}
	base, err := d.layer(minbase, "", "minbase")
	if err != nil {
		return nil, err
	}
	if len(packages) == 0 {
		return []v1.Layer{base}, nil
	}
	full, err := d.rootTar(ctx, packages)
	if err != nil {
		return nil, err
	}
	diff, err := d.layer(full, minbase, strings.Join(sortedCopy(packages), ","))
	if err != nil {
		return nil, err
	}
	return []v1.Layer{base, diff}, nil
}

// key names the cache entry of a debootstrap with packages.
func (d *Debian) key(packages []string) string {
	h := sha256.Sum256([]byte(strings.Join([]string{"images-debootstrap/v1", d.Suite, "minbase", d.Arch, d.Mirror,
		strings.Join(sortedCopy(packages), ",")}, "\n")))
	return fmt.Sprintf("root-%s-%s-%s", d.Suite, d.Arch, hex.EncodeToString(h[:6]))
}

// rootTar returns the cached, normalised tar of the tree debootstrap makes
// with packages, building it first when it is missing or older than MaxAge.
func (d *Debian) rootTar(ctx context.Context, packages []string) (string, error) {
	file := filepath.Join(d.CacheDir, d.key(packages)+".tar")
	unlock, err := flock(ctx, file+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if fi, err := os.Stat(file); err == nil && (d.MaxAge <= 0 || time.Since(fi.ModTime()) < d.MaxAge) {
		return file, nil
	}
	tmp, err := os.MkdirTemp(d.CacheDir, ".build-")
	if err != nil {
		return "", err
	}
	defer func() {
		unmountUnder(tmp) // a failed debootstrap can leave proc/sys mounted in the target
		_ = os.RemoveAll(tmp)
	}()
	rootfs := filepath.Join(tmp, "rootfs")
	start := time.Now()
	fmt.Fprintf(d.Log, "images: debootstrap %s minbase %s from %s (cached in %s; minutes the first time)\n",
		d.Suite, strings.Join(packages, " "), d.Mirror, d.CacheDir)
	if err := d.debootstrap(ctx, packages, rootfs, filepath.Join(tmp, "debootstrap.log")); err != nil {
		return "", err
	}
	if err := normalizeRoot(rootfs); err != nil {
		return "", fmt.Errorf("normalise %s: %w", rootfs, err)
	}
	if err := writeFileAtomic(file, func(w io.Writer) error { return writeTreeTar(ctx, rootfs, w) }); err != nil {
		return "", fmt.Errorf("cache debootstrap tree: %w", err)
	}
	fmt.Fprintf(d.Log, "images: debootstrap done in %s\n", time.Since(start).Round(time.Second))
	return file, nil
}

func (d *Debian) debootstrap(ctx context.Context, packages []string, rootfs, logFile string) error {
	bin, err := exec.LookPath("debootstrap")
	if err != nil {
		return fmt.Errorf("debootstrap not found (run `make deps` or apt-get install debootstrap): %w", err)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("debootstrap needs root (file owners, chroot): run make images as root")
	}
	debs := filepath.Join(d.CacheDir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	args := []string{"--variant=minbase", "--arch=" + d.Arch, "--cache-dir=" + debs}
	if len(packages) > 0 {
		args = append(args, "--include="+strings.Join(sortedCopy(packages), ","))
	}
	args = append(args, d.Suite, rootfs, d.Mirror)
	log, err := os.Create(logFile)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	cmd.Stdout, cmd.Stderr = log, log
	// Own process group, so cancelling also stops dpkg and its scripts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logFile)
		return fmt.Errorf("debootstrap %s: %w\n%s", strings.Join(args, " "), err, tail(string(out), 15))
	}
	return nil
}

// layer returns the gzipped layer of the tree in file (when over is empty)
// or of what file changes over the tree in over, cached next to them.
func (d *Debian) layer(file, over, what string) (v1.Layer, error) {
	stamp := func(p string) string {
		fi, err := os.Stat(p)
		if err != nil {
			return "0"
		}
		return fmt.Sprint(fi.ModTime().UnixNano())
	}
	// The blob's name carries the build stamps of its inputs: a rebuilt
	// tree gets a new blob.
	name := strings.TrimSuffix(filepath.Base(file), ".tar") + "-" + stamp(file)
	if over != "" {
		name += "-over-" + strings.TrimSuffix(filepath.Base(over), ".tar") + "-" + stamp(over)
	}
	blob := filepath.Join(d.CacheDir, "layer-"+name+".tar.gz")
	if l, ok := d.layers[blob]; ok {
		return l, nil
	}
	if _, err := os.Stat(blob); err != nil {
		removeStale(d.CacheDir, strings.TrimSuffix(filepath.Base(file), ".tar"), over != "", blob)
		write := func(w io.Writer) error { return gzipTar(w, file) }
		if over != "" {
			write = func(w io.Writer) error { return gzipDiff(w, over, file) }
		}
		if err := writeFileAtomic(blob, write); err != nil {
			return nil, fmt.Errorf("layer %s: %w", what, err)
		}
	}
	l, err := tarball.LayerFromFile(blob, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", what, err)
	}
	if d.layers == nil {
		d.layers = map[string]v1.Layer{}
	}
	d.layers[blob] = l
	return l, nil
}

// removeStale deletes the older blobs of the same kind (full tree or diff)
// made from tree, keeping keep.
func removeStale(dir, tree string, diff bool, keep string) {
	m, _ := filepath.Glob(filepath.Join(dir, "layer-"+tree+"-*.tar.gz"))
	for _, f := range m {
		if f != keep && strings.Contains(filepath.Base(f), "-over-") == diff {
			_ = os.Remove(f)
		}
	}
}

// normalizeRoot removes from a fresh debootstrap tree what differs from run
// to run or belongs to the build host: logs, apt's downloaded lists and
// packages, caches, backup files, the host's resolv.conf and hostname
// (the runtime provides them) and device nodes (the runtime provides /dev).
func normalizeRoot(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	var errs []error
	drop := func(p string) {
		if err := root.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	empty := func(p string) {
		if _, err := root.Lstat(p); err == nil {
			errs = append(errs, root.WriteFile(p, nil, 0o644))
		}
	}
	drop("debootstrap")
	for _, glob := range []string{
		"var/log/*.log", "var/log/apt/*", "var/cache/apt/archives/*.deb", "var/cache/apt/*.bin",
		"var/lib/apt/lists/*_*", "var/cache/ldconfig/aux-cache", "var/lib/dpkg/*-old",
		"var/cache/debconf/*-old", "etc/*-", "dev/*", "run/*", "tmp/*",
	} {
		m, err := filepath.Glob(filepath.Join(rootfs, glob))
		if err != nil {
			return err
		}
		for _, p := range m {
			rel, _ := filepath.Rel(rootfs, p)
			drop(rel)
		}
	}
	empty("etc/resolv.conf")
	empty("etc/hostname")
	empty("etc/machine-id")
	return errors.Join(errs...)
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mps []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mps = append(mps, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mps)))
	for _, mp := range mps {
		_ = unix.Unmount(mp, unix.MNT_DETACH)
	}
}

// flock takes an exclusive lock on file (created if missing) until unlock.
func flock(ctx context.Context, file string) (func(), error) {
	f, err := os.OpenFile(file, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); _ = f.Close() }, nil
		}
		if err != unix.EWOULDBLOCK {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", file, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// writeFileAtomic writes file through write into a temporary file that is
// renamed into place only when write succeeded.
func writeFileAtomic(file string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err := write(f); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), file)
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
