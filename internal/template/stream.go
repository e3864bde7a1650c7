package template

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/cube-dev/cube/internal/errdefs"
)

// StreamSource is the Source recorded for templates imported with
// ImportTarStream.
const StreamSource = "stream"

// ImportTarStream registers a template called name from an uncompressed tar
// stream of a root filesystem (as written by WriteTar) and verifies the
// result: the digest of the prepared rootfs must equal wantDigest
// ("sha256:<64 hex>"). On a mismatch, as on any other failure, nothing is
// registered and the error wraps errdefs.ErrConflict naming both digests.
// The same extraction rules as ImportTar apply. r is read only after the
// name lock is held and only when name is not registered yet (then the
// error wraps errdefs.ErrAlreadyExists), so a lazily opened r costs nothing
// when another caller won the race.
func (r *Registry) ImportTarStream(ctx context.Context, name string, rd io.Reader, wantDigest string) (Template, error) {
	if err := ValidateDigest(wantDigest); err != nil {
		return Template{}, fmt.Errorf("import template %q: %w", name, err)
	}
	return r.registerDigest(ctx, name, wantDigest, func(ctx context.Context, rootfs string) (string, error) {
		if err := extractTar(ctx, rd, rootfs); err != nil {
			return "", fmt.Errorf("extract stream: %w", err)
		}
		return StreamSource, nil
	})
}

// WriteTar writes the tree at rootfs to w as an uncompressed tar stream in
// lexical path order, paths relative to rootfs ("./" for rootfs itself).
// Modes (incl. setuid/setgid/sticky), owners, modification times, symlinks,
// FIFOs and hard links are kept; device nodes and sockets are left out.
// Nothing is buffered beyond one file's copy buffer.
func WriteTar(ctx context.Context, rootfs string, w io.Writer) error {
	return writeTar(ctx, rootfs, w)
}

// ValidateDigest reports whether d has the form of a template Digest,
// "sha256:" followed by 64 lower-case hex digits.
func ValidateDigest(d string) error {
	hx, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hx) != 64 || strings.ToLower(hx) != hx {
		return fmt.Errorf("digest %q: want sha256:<64 hex digits>: %w", d, errdefs.ErrInvalidArgument)
	}
	if _, err := hex.DecodeString(hx); err != nil {
		return fmt.Errorf("digest %q: want sha256:<64 hex digits>: %w", d, errdefs.ErrInvalidArgument)
	}
	return nil
}
