// Command images builds Cube's container images as OCI image layouts under
// out/images/<name>, without a Docker engine: the static binaries on an
// empty (scratch) base, with fixed timestamps so the same binaries always
// give the same digests. deploy/images/<name>/Dockerfile are the full images
// (Debian base with e2fsprogs, debootstrap, ...); this is the minimal,
// checkable variant. Run it with `make images` or `go run ./hack/images`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"

	"github.com/cube-dev/cube/internal/version"
)

func main() {
	out := flag.String("out", "out/images", "directory the OCI layouts are written under (one per image)")
	bin := flag.String("bin", "", "directory with prebuilt static cube, envd, cube-shim, cube-supervisor and cube-reaper (empty: build them)")
	ver := flag.String("version", version.Version, "image version (label org.opencontainers.image.version)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *out, *bin, *ver); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, bin, ver string) error {
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
		dir := filepath.Join(out, spec.Name)
		d, err := WriteLayout(dir, spec, bin)
		if err != nil {
			return err
		}
		fmt.Printf("%-12s %s  %s\n", spec.Name, d, dir)
	}
	return nil
}
