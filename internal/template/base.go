package template

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// BaseName is the default template every Cube installation has.
const BaseName = "base"

// BaseSpec says how the base template is built with debootstrap.
type BaseSpec struct {
	Suite    string
	Variant  string
	Packages []string
	Arch     string // Debian architecture name
}

// DefaultBaseSpec is the recipe for the `base` template.
func DefaultBaseSpec() BaseSpec {
	return BaseSpec{
		Suite:    "bookworm",
		Variant:  "minbase",
		Packages: []string{"bash", "coreutils", "python3", "ca-certificates", "procps"},
		Arch:     debianArch(runtime.GOARCH),
	}
}

// CacheKey identifies the debootstrap result of spec in the cache directory.
func (s BaseSpec) CacheKey() string {
	pk := append([]string(nil), s.Packages...)
	sort.Strings(pk)
	sum := sha256.Sum256([]byte(strings.Join([]string{"debootstrap/v1", s.Suite, s.Variant, s.Arch, strings.Join(pk, ",")}, "\n")))
	return fmt.Sprintf("debootstrap-%s-%s-%s", s.Suite, s.Arch, hex.EncodeToString(sum[:6]))
}

// EnsureBase returns the `base` template, building it first if missing:
// from the cached debootstrap result in CacheDir when there is one (seconds),
// else by running debootstrap against the machine's Debian mirror (minutes;
// needs root and network access to the mirror) and caching the result.
// debootstrap's output and progress notes are written to progress, line by
// line; progress may be nil.
func (r *Registry) EnsureBase(ctx context.Context, progress io.Writer) (Template, error) {
	if progress == nil {
		progress = io.Discard
	}
	// Leftovers of builds a crash interrupted go at every start, not only
	// when base is missing: a restart finds base present.
	if err := r.Cleanup(ctx); err != nil {
		return Template{}, err
	}
	if t, err := r.Get(ctx, BaseName); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	unlock, err := r.lock(ctx, BaseName)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	if t, err := r.Get(ctx, BaseName); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return t, err // built meanwhile by another process
	}
	spec := DefaultBaseSpec()
	return r.build(ctx, BaseName, func(ctx context.Context, rootfs string) (string, error) {
		return r.fillBase(ctx, spec, rootfs, progress)
	})
}

// fillBase extracts the cached debootstrap result into rootfs, building and
// caching it first when needed.
func (r *Registry) fillBase(ctx context.Context, spec BaseSpec, rootfs string, progress io.Writer) (string, error) {
	cacheDir := r.cacheDir()
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("create cache dir: %w", err)
	}
	cacheFile := filepath.Join(cacheDir, spec.CacheKey()+".tar")
	unlock, err := flock(ctx, cacheFile+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	mirror := DebianMirror()
	source := fmt.Sprintf("debootstrap:%s variant=%s include=%s mirror=%s", spec.Suite, spec.Variant, strings.Join(spec.Packages, ","), mirror)

	if cached, err := fillFromCache(ctx, cacheFile, rootfs, "base template", progress); err != nil || cached {
		return source + " (cached)", err
	}

	start := time.Now()
	fmt.Fprintf(progress, "cube: building base template with debootstrap %s from %s (takes a few minutes)\n", spec.Suite, mirror)
	if err := debootstrap(ctx, spec, mirror, rootfs, progress); err != nil {
		return "", err
	}
	if err := cleanAptCaches(rootfs); err != nil {
		return "", fmt.Errorf("clean apt caches: %w", err)
	}
	// Same content whether or not the cache is used: the tar leaves them out.
	if err := removeSpecialFiles(ctx, rootfs); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "cube: debootstrap done in %s; caching in %s\n", time.Since(start).Round(time.Second), cacheFile)
	if err := writeTarCache(ctx, rootfs, cacheFile); err != nil {
		// The template is still good; only the cache is missing.
		fmt.Fprintf(progress, "cube: could not cache base template: %v\n", err)
	}
	return source, nil
}

// debootstrap runs debootstrap into target, streaming its output to progress.
func debootstrap(ctx context.Context, spec BaseSpec, mirror, target string, progress io.Writer) error {
	bin, err := exec.LookPath("debootstrap")
	if err != nil {
		return fmt.Errorf("debootstrap not found (run `make deps` or apt-get install debootstrap): %w", errdefs.ErrFailedPrecondition)
	}
	args := []string{
		"--variant=" + spec.Variant,
		"--include=" + strings.Join(spec.Packages, ","),
		"--arch=" + spec.Arch,
		spec.Suite, target, mirror,
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	tail, err := runStreaming(cmd, progress, 10)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("debootstrap: %w", ctx.Err())
		}
		return fmt.Errorf("debootstrap %s failed (see %s/debootstrap/debootstrap.log if kept): %w\n%s",
			spec.Suite, target, err, strings.Join(tail, "\n"))
	}
	return nil
}

// runStreaming runs cmd in a process group of its own (cancellation kills
// dpkg & co. too), copies its output line by line to progress and returns
// the last keep lines with the error.
func runStreaming(cmd *exec.Cmd, progress io.Writer, keep int) (tail []string, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(progress, line)
			if tail = append(tail, line); len(tail) > keep {
				tail = tail[1:]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	err = cmd.Run()
	_ = pw.Close()
	<-done
	return tail, err
}

// cleanAptCaches removes downloaded packages, package caches and package
// lists from rootfs (run `apt-get update` inside a sandbox to get lists).
func cleanAptCaches(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	rules := []struct {
		dir  string
		drop func(fs.DirEntry) bool
	}{
		{"var/cache/apt/archives", func(e fs.DirEntry) bool { return strings.HasSuffix(e.Name(), ".deb") }},
		{"var/cache/apt", func(e fs.DirEntry) bool { return strings.HasSuffix(e.Name(), ".bin") }},
		{"var/lib/apt/lists", func(e fs.DirEntry) bool { return e.Name() != "partial" && e.Name() != "lock" }},
	}
	for _, rule := range rules {
		entries, err := fs.ReadDir(root.FS(), rule.dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range entries {
			if rule.drop(e) {
				if err := root.RemoveAll(rule.dir + "/" + e.Name()); err != nil {
					return err
				}
			}
		}
	}
	return root.RemoveAll("debootstrap")
}

// removeSpecialFiles deletes device nodes and sockets below rootfs (the
// runtime provides /dev).
func removeSpecialFiles(ctx context.Context, rootfs string) error {
	return filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.Type()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket) != 0 {
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("remove device node: %w", err)
			}
		}
		return nil
	})
}

// emptyDir removes the contents of dir, keeping dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// DebianMirror returns the first Debian archive URI from the machine's apt
// sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and
// deb822 *.sources), preferring entries that are not security or updates
// archives, else http://deb.debian.org/debian.
func DebianMirror() string {
	return debianMirror("/etc/apt")
}

const defaultMirror = "http://deb.debian.org/debian"

func debianMirror(aptDir string) string {
	var uris []string
	if b, err := os.ReadFile(filepath.Join(aptDir, "sources.list")); err == nil {
		uris = append(uris, oneLineURIs(string(b))...)
	}
	if m, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.list")); len(m) > 0 {
		for _, f := range m {
			if b, err := os.ReadFile(f); err == nil {
				uris = append(uris, oneLineURIs(string(b))...)
			}
		}
	}
	if m, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*.sources")); len(m) > 0 {
		for _, f := range m {
			if b, err := os.ReadFile(f); err == nil {
				uris = append(uris, deb822URIs(string(b))...)
			}
		}
	}
	for _, u := range uris {
		if strings.Contains(u, "security") || strings.Contains(u, "updates") || strings.Contains(u, "backports") {
			continue
		}
		if strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:/") {
			return strings.TrimRight(u, "/")
		}
	}
	return defaultMirror
}

// oneLineURIs parses "deb [options] uri suite components" lines.
func oneLineURIs(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options, possibly spanning fields
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 {
			out = append(out, f[0])
		}
	}
	return out
}

// deb822URIs parses the URIs of enabled "Types: deb" stanzas.
func deb822URIs(text string) []string {
	var out []string
	for _, stanza := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n\n") {
		fields := map[string]string{}
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(line, "#") || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t") {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if ok {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if !containsWord(fields["types"], "deb") || strings.EqualFold(fields["enabled"], "no") {
			continue
		}
		out = append(out, strings.Fields(fields["uris"])...)
	}
	return out
}

func containsWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

func debianArch(goarch string) string {
	switch goarch {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	case "mips64le":
		return "mips64el"
	default: // amd64, arm64, s390x, riscv64 share their names
		return goarch
	}
}

// fillFromCache fills rootfs from the cached tar of a built template, if
// there is one (what names it in progress lines). An unusable cache file is
// removed and rootfs emptied, so the caller builds afresh: cached is false.
func fillFromCache(ctx context.Context, cacheFile, rootfs, what string, progress io.Writer) (cached bool, err error) {
	if _, err := os.Stat(cacheFile); err != nil {
		return false, nil
	}
	fmt.Fprintf(progress, "cube: %s: using cached %s\n", what, cacheFile)
	err = extractTarFile(ctx, cacheFile, rootfs)
	if err == nil {
		return true, nil
	}
	if ctx.Err() != nil {
		return false, err
	}
	fmt.Fprintf(progress, "cube: cache %s is unusable (%v); rebuilding\n", cacheFile, err)
	_ = os.Remove(cacheFile)
	return false, emptyDir(rootfs)
}
