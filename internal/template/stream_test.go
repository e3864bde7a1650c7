package template

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/cube-dev/cube/internal/errdefs"
)

// failReader fails the test when read: nothing may be read before the
// digest is validated and the name lock is held on an unregistered name.
type failReader struct{ t *testing.T }

func (f failReader) Read([]byte) (int, error) {
	f.t.Error("stream read although it should not be")
	return 0, io.ErrUnexpectedEOF
}

func TestImportTarStream(t *testing.T) {
	requireRoot(t)
	ctx := testCtx(t)
	src := newTestRegistry(t)
	orig, err := src.ImportDir(ctx, "orig", writeTree(t))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTar(ctx, orig.RootfsPath, &buf); err != nil {
		t.Fatal(err)
	}
	stream := buf.Bytes()

	t.Run("round trip keeps the digest", func(t *testing.T) {
		r := newTestRegistry(t)
		got, err := r.ImportTarStream(ctx, "copy", bytes.NewReader(stream), orig.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if got.Digest != orig.Digest || got.Source != StreamSource {
			t.Fatalf("got %+v, want digest %s", got, orig.Digest)
		}
		// Registered once: a second import is ErrAlreadyExists without reading.
		if _, err := r.ImportTarStream(ctx, "copy", failReader{t}, orig.Digest); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("second import: %v", err)
		}
	})
	t.Run("digest mismatch registers nothing", func(t *testing.T) {
		r := newTestRegistry(t)
		want := "sha256:" + strings.Repeat("0", 64)
		_, err := r.ImportTarStream(ctx, "copy", bytes.NewReader(stream), want)
		if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), orig.Digest) || !strings.Contains(err.Error(), want) {
			t.Fatalf("err %v: want ErrConflict naming both digests", err)
		}
		if _, err := r.Get(ctx, "copy"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("registered after a mismatch: %v", err)
		}
		assertNoStaging(t, r)
	})
	t.Run("bad digest is refused before reading", func(t *testing.T) {
		r := newTestRegistry(t)
		for _, d := range []string{"", "sha256:abc", "md5:" + strings.Repeat("0", 64), "sha256:" + strings.Repeat("A", 64)} {
			if _, err := r.ImportTarStream(ctx, "copy", failReader{t}, d); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("digest %q: %v", d, err)
			}
		}
	})
	t.Run("hostile stream registers nothing", func(t *testing.T) {
		r := newTestRegistry(t)
		file := writeTarFile(t, false, reg("../escape", "x", 0o644))
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := r.ImportTarStream(ctx, "copy", f, orig.Digest); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("err %v", err)
		}
		if _, err := r.Get(ctx, "copy"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("registered: %v", err)
		}
		assertNoStaging(t, r)
	})
}
