package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// InterpName is the built-in template of the code interpreter: the name
// `@e2b/code-interpreter` creates sandboxes from.
const InterpName = "code-interpreter-v1"

// InterpMarker, a file in a template's rootfs, asks for the code-interpreter
// server (cube-interp, port 49999) in the template's sandboxes. It is part
// of the rootfs, so it travels with the template to every node and is
// covered by its digest; any template can carry it.
const InterpMarker = "etc/cube/code-interpreter"

// InterpPackages are the Debian packages the code-interpreter template adds
// to base: the Python kernel and the libraries agents use most. They are
// installed with apt inside the base rootfs (debootstrap's own resolver
// takes the first alternative of every dependency and drops virtual ones,
// which breaks python3-zmq and drags in a C++ toolchain).
var InterpPackages = []string{
	"python3-ipykernel", "python3-numpy", "python3-pandas", "python3-matplotlib", "python3-requests",
}

// interpPreinstall are installed first so that apt takes them for the
// alternatives they are in: python3-fonttools (matplotlib) depends on
// "python3-scipy | python3-munkres", and scipy pulls g++ and boost through
// pythran (~300 MB).
var interpPreinstall = []string{"python3-munkres"}

// InterpCacheKey identifies the cached rootfs of the code-interpreter
// template: base's key plus what apt installs on top.
func InterpCacheKey() string {
	sum := sha256.Sum256([]byte(strings.Join([]string{"interp-apt/v1", DefaultBaseSpec().CacheKey(),
		strings.Join(interpPreinstall, ","), strings.Join(InterpPackages, ",")}, "\n")))
	return "code-interpreter-" + hex.EncodeToString(sum[:6])
}

// HasInterp reports whether the template rootfs asks for the code
// interpreter (InterpMarker).
func HasInterp(rootfs string) bool {
	st, err := os.Stat(filepath.Join(rootfs, InterpMarker))
	return err == nil && st.Mode().IsRegular()
}

// EnsureInterp returns the code-interpreter template, building it first if
// missing, as EnsureBase does for base (minutes without a cached
// debootstrap, seconds with one). progress may be nil.
func (r *Registry) EnsureInterp(ctx context.Context, progress io.Writer) (Template, error) {
	if progress == nil {
		progress = io.Discard
	}
	if t, err := r.Get(ctx, InterpName); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	unlock, err := r.lock(ctx, InterpName)
	if err != nil {
		return Template{}, err
	}
	defer unlock()
	if t, err := r.Get(ctx, InterpName); err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return t, err // built meanwhile by another process
	}
	return r.buildSpec(ctx, InterpName, buildSpec{
		fill: func(ctx context.Context, rootfs string) (string, error) {
			return r.fillInterp(ctx, rootfs, progress)
		},
		finish: func(_ context.Context, rootfs string, _ *Template) error {
			return writeInterpMarker(rootfs)
		},
	})
}

// writeInterpMarker writes InterpMarker into rootfs (through an os.Root: a
// symlink in the image cannot redirect it).
func writeInterpMarker(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(filepath.Dir(InterpMarker), 0o755); err != nil {
		return fmt.Errorf("code-interpreter marker: %w", err)
	}
	body := []byte("# Sandboxes of this template run the code-interpreter server (cube-interp) on port 49999.\n")
	if err := root.WriteFile(InterpMarker, body, 0o644); err != nil {
		return fmt.Errorf("code-interpreter marker: %w", err)
	}
	return nil
}
