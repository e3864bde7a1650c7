// Command images builds Cube's container images as OCI image layouts under
// out/images/<name>, without a Docker engine, with the contents of
// deploy/images/<name>/Dockerfile: a Debian bookworm base made with
// debootstrap from this machine's apt mirror (minbase, then the packages
// the Dockerfile installs), then the static binaries. File times are fixed
// and the Debian trees are cached under $CUBE_CACHE_DIR/images, so a warm
// build is fast and the same cache and binaries give the same digests. Run
// it as root (debootstrap) with `make images` or `go run ./hack/images`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/cube-dev/cube/internal/version"
)

func main() {
	out := flag.String("out", "out/images", "directory the OCI layouts are written under (one per image)")
	bin := flag.String("bin", "", "directory with prebuilt static cube, envd, cube-shim, cube-supervisor, cube-reaper, cube-interp and cube-nsexec (empty: build them)")
	ver := flag.String("version", version.Version, "image version (label org.opencontainers.image.version)")
	cache := flag.String("cache-dir", filepath.Join(cacheDir(), "images"), "where the Debian trees and layers are cached")
	maxAge := flag.Duration("base-max-age", 7*24*time.Hour, "rebuild a cached Debian tree older than this (picks up Debian updates); 0: never")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	deb := NewDebian(*cache)
	deb.MaxAge = *maxAge
	if err := run(ctx, deb, *out, *bin, *ver); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// cacheDir is $CUBE_CACHE_DIR, else /var/cache/cube (as internal/template).
func cacheDir() string {
	if d := os.Getenv("CUBE_CACHE_DIR"); d != "" {
		return d
	}
	return "/var/cache/cube"
}

func run(ctx context.Context, deb *Debian, out, bin, ver string) error {
	if bin == "" {
		tmp, err := os.MkdirTemp("", "cube-images-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := buildBinaries(ctx, tmp, ver); err != nil {
			return err
		}
		bin = tmp
	}
	for _, spec := range Specs(ver) {
		base, err := deb.Layers(ctx, spec.Packages)
		if err != nil {
			return fmt.Errorf("image %s: %w", spec.Name, err)
		}
		dir := filepath.Join(out, spec.Name)
		d, err := WriteLayout(dir, spec, base, bin)
		if err != nil {
			return err
		}
		fmt.Printf("%-12s %s  %s\n", spec.Name, d, dir)
	}
	return nil
}
