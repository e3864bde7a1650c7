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
// ("sha256:<64 hex>"). It is ImportStream with only a digest published.
func (r *Registry) ImportTarStream(ctx context.Context, name string, rd io.Reader, wantDigest string) (Template, error) {
	return r.ImportStream(ctx, name, rd, Published{Digest: wantDigest})
}

// Published is what a server publishes about a template it ships (see
// package templatedist): the node registers the stream under it.
type Published struct {
	// Digest is the template's Digest; required.
	Digest string
	// XattrDigest is XattrDigest of the server's rootfs; "" when it has
	// no xattrs or the server predates xattrs in streams (then xattrs
	// that arrive anyway are kept unchecked).
	XattrDigest string
	// CPUCount, MemoryMB and DiskSizeMB are the template's sizes; 0 means
	// the registry's default.
	CPUCount, MemoryMB, DiskSizeMB int
	// Defaults are the template's sandbox defaults; nil for none.
	Defaults *Defaults
	// Layers is the template's full stack (bottom first) for a layered
	// template; empty for a flat one.
	Layers []LayerRef
}

// validatePublished checks the form of p's digests and sizes.
func validatePublished(p Published) error {
	if err := ValidateDigest(p.Digest); err != nil {
		return err
	}
	if p.XattrDigest != "" {
		if err := ValidateDigest(p.XattrDigest); err != nil {
			return fmt.Errorf("xattr %w", err)
		}
	}
	if p.CPUCount < 0 || p.MemoryMB < 0 || p.DiskSizeMB < 0 {
		return fmt.Errorf("negative size (cpu %d, memory %d MB, disk %d MB): %w",
			p.CPUCount, p.MemoryMB, p.DiskSizeMB, errdefs.ErrInvalidArgument)
	}
	for _, l := range p.Layers {
		if err := ValidateDigest(l.Digest); err != nil {
			return fmt.Errorf("layer %w", err)
		}
	}
	return nil
}

// ImportStream registers a template called name from an uncompressed tar
// stream of a root filesystem (as written by WriteTar), with p's sizes and
// defaults, and verifies the result: the digest of the prepared rootfs must
// equal p.Digest and, when p.XattrDigest is set, its XattrDigest must equal
// that. On a mismatch, as on any other failure, nothing is registered and
// the error wraps errdefs.ErrConflict naming both digests. The same
// extraction rules as ImportTar apply. rd is read only after the name lock
// is held and only when name is not registered yet (then the error wraps
// errdefs.ErrAlreadyExists), so a lazily opened rd costs nothing when
// another caller won the race.
func (r *Registry) ImportStream(ctx context.Context, name string, rd io.Reader, p Published) (Template, error) {
	if err := validatePublished(p); err != nil {
		return Template{}, fmt.Errorf("import template %q: %w", name, err)
	}
	return r.registerSpec(ctx, name, buildSpec{
		want: p.Digest,
		fill: func(ctx context.Context, rootfs string) (string, error) {
			if err := extractTar(ctx, rd, rootfs); err != nil {
				return "", fmt.Errorf("extract stream: %w", err)
			}
			return StreamSource, nil
		},
		finish: func(ctx context.Context, rootfs string, t *Template) error {
			if err := checkXattrDigest(ctx, name, rootfs, p.XattrDigest); err != nil {
				return err
			}
			t.CPUCount, t.MemoryMB, t.DiskSizeMB = p.CPUCount, p.MemoryMB, p.DiskSizeMB
			t.Defaults = p.Defaults
			return nil
		},
	})
}

// WriteTar writes the tree at rootfs to w as an uncompressed tar stream in
// lexical path order, paths relative to rootfs ("./" for rootfs itself).
// Modes (incl. setuid/setgid/sticky), owners, modification times, symlinks,
// FIFOs, hard links and xattrs (PAX SCHILYXATTR records, security.selinux
// excepted) are kept; device nodes and sockets are left out.
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
