package templatebuild

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ErrTooLarge marks an upload past the size bound (HTTP 413 at the boundary).
var ErrTooLarge = fmt.Errorf("%w: upload too large", errdefs.ErrInvalidArgument)

// fileStore keeps the uploaded COPY archives by files hash in the
// control-plane store, so that any replica can run a build whose files
// were uploaded through another. An upload is spooled to a temporary file
// in dir (bounded by maxBytes and checked to be a tar archive) before it is
// copied into the store chunk by chunk: a slow client never holds a
// database transaction, and a bad archive never reaches the store. The
// first complete upload of a hash wins; later ones are read and dropped.
type fileStore struct {
	st       FileStore
	dir      string
	maxBytes int64
}

// FileStore is the part of the control-plane store holding uploaded files.
type FileStore interface {
	PutTemplateFile(ctx context.Context, hash string, r io.Reader) (bool, error)
	TouchTemplateFile(ctx context.Context, hash string) (bool, error)
	OpenTemplateFile(ctx context.Context, hash string) (io.ReadCloser, error)
	DeleteUnusedTemplateFiles(ctx context.Context, usedBefore, orphansBefore time.Time) ([]string, error)
}

// used reports whether the archive of hash is stored and, if so, marks it
// used now, which keeps it from the collector.
func (f *fileStore) used(ctx context.Context, hash string) (bool, error) {
	if !ValidHash(hash) {
		return false, nil
	}
	return f.st.TouchTemplateFile(ctx, hash)
}

// put stores body as the archive of hash after checking that it is a
// readable tar, plain or gzip-compressed.
func (f *fileStore) put(ctx context.Context, hash string, body io.Reader) (err error) {
	if !ValidHash(hash) {
		return fmt.Errorf("%w: files hash %q must be 64 lowercase hex characters", errdefs.ErrInvalidArgument, hash)
	}
	if present, err := f.used(ctx, hash); err != nil {
		return fmt.Errorf("store template files: %w", err)
	} else if present {
		// Written once by hash: read the body so that the client sees a
		// clean answer, and keep the stored archive.
		if _, err := io.Copy(io.Discard, io.LimitReader(body, f.maxBytes+1)); err != nil {
			return fmt.Errorf("%w: read upload: %w", errdefs.ErrInvalidArgument, err)
		}
		return nil
	}
	if err := os.MkdirAll(f.dir, 0o700); err != nil {
		return fmt.Errorf("store template files: %w", err)
	}
	tmp, err := os.CreateTemp(f.dir, ".tmp-"+hash+"-")
	if err != nil {
		return fmt.Errorf("store template files: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	n, err := io.Copy(tmp, io.LimitReader(body, f.maxBytes+1))
	if err != nil {
		return fmt.Errorf("%w: read upload: %w", errdefs.ErrInvalidArgument, err)
	}
	if n > f.maxBytes {
		return fmt.Errorf("%w: the archive is larger than %d bytes", ErrTooLarge, f.maxBytes)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("store template files: %w", err)
	}
	if err := checkArchive(tmp); err != nil {
		return err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("store template files: %w", err)
	}
	if _, err := f.st.PutTemplateFile(ctx, hash, tmp); err != nil {
		return fmt.Errorf("store template files: %w", err)
	}
	return nil
}

// open returns the stored archive of hash; ErrNotFound when none.
func (f *fileStore) open(ctx context.Context, hash string) (io.ReadCloser, error) {
	if !ValidHash(hash) {
		return nil, fmt.Errorf("%w: files hash %q", errdefs.ErrInvalidArgument, hash)
	}
	r, err := f.st.OpenTemplateFile(ctx, hash)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("files %s: %w: they were never uploaded", hash, errdefs.ErrNotFound)
	}
	return r, err
}

// importLocal moves what an earlier version kept in dir (uploads as
// <dir>/<hash>) into the store and removes the spool files a killed
// process left. Errors are joined; the rest goes on.
func (f *fileStore) importLocal(ctx context.Context) error {
	entries, err := os.ReadDir(f.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", f.dir, err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(f.dir, e.Name())
		if ValidHash(e.Name()) && e.Type().IsRegular() {
			file, err := os.Open(p)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			_, err = f.st.PutTemplateFile(ctx, e.Name(), file)
			file.Close()
			if err != nil {
				errs = append(errs, fmt.Errorf("import %s: %w", p, err))
				continue
			}
		} else if !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tarReader returns a tar reader over r, decompressing it when it starts
// with the gzip magic bytes (the SDK sends no header saying which).
func tarReader(r io.Reader) (*tar.Reader, error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: bad gzip archive: %w", errdefs.ErrInvalidArgument, err)
		}
		return tar.NewReader(zr), nil
	}
	return tar.NewReader(br), nil
}

func checkArchive(r io.Reader) error {
	tr, err := tarReader(r)
	if err != nil {
		return err
	}
	for {
		_, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: the upload is not a tar archive (plain or gzip): %w", errdefs.ErrInvalidArgument, err)
		}
	}
}

// sanitizeTar copies the archive r to w as a plain tar that is safe to
// extract with any tar: entries with absolute names or `..` are dropped,
// and so are entries below a path an earlier entry made a symlink (node-tar
// descends through symlinked directories, so a naive extractor would write
// through the link). Hard links must point at an earlier kept entry.
func sanitizeTar(r io.Reader, w io.Writer) error {
	tr, err := tarReader(r)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	links := map[string]bool{} // paths that are symlinks
	kept := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: read uploaded archive: %w", errdefs.ErrInvalidArgument, err)
		}
		name, ok := safeName(h.Name)
		if !ok || underLink(name, links) {
			continue
		}
		if h.Typeflag == tar.TypeLink {
			target, ok := safeName(h.Linkname)
			if !ok || !kept[target] {
				continue
			}
			h.Linkname = target
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
		default:
			continue // devices, fifos: nothing a COPY should create
		}
		delete(links, name)
		if h.Typeflag == tar.TypeSymlink {
			links[name] = true
		}
		h.Name = name
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		// Let the writer pick the simplest format (USTAR when it fits, so
		// busybox tar reads it); the COPY step sets owners itself.
		h.Format, h.PAXRecords, h.Xattrs = tar.FormatUnknown, nil, nil //nolint:staticcheck // Xattrs must be cleared too
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return fmt.Errorf("copy %s: %w", name, err)
			}
		}
		kept[name] = true
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	return nil
}

// safeName cleans a tar entry name; it refuses absolute names and names
// leaving the root.
func safeName(name string) (string, bool) {
	if name == "" || strings.HasPrefix(name, "/") {
		return "", false
	}
	for _, part := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if part == ".." {
			return "", false
		}
	}
	c := path.Clean(name)
	if c == "." || c == "" {
		return "", false
	}
	return c, true
}

// underLink reports whether a proper parent of name is a symlink.
func underLink(name string, links map[string]bool) bool {
	for p := path.Dir(name); p != "." && p != "/"; p = path.Dir(p) {
		if links[p] {
			return true
		}
	}
	return false
}

// uploadToken signs (hash, expires) for the upload URL of a files hash.
func uploadToken(secret []byte, hash string, expires int64) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("cube-template-files-v1\x00" + hash + "\x00" + strconv.FormatInt(expires, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// verifyUploadToken checks the token and expiry of an upload URL: a
// missing token is ErrUnauthenticated, a wrong or expired one
// ErrPermissionDenied.
func verifyUploadToken(secret []byte, hash, token, expires string, now time.Time) error {
	if token == "" || expires == "" {
		return fmt.Errorf("%w: the upload URL has no token; ask GET /templates/{templateID}/files/{hash} for one", errdefs.ErrUnauthenticated)
	}
	exp, err := strconv.ParseInt(expires, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: bad expires %q in the upload URL", errdefs.ErrPermissionDenied, expires)
	}
	want := uploadToken(secret, hash, exp)
	if !hmac.Equal([]byte(want), []byte(token)) {
		return fmt.Errorf("%w: the upload token does not match this files hash", errdefs.ErrPermissionDenied)
	}
	if now.Unix() > exp {
		return fmt.Errorf("%w: the upload URL expired at %s; ask for a new one", errdefs.ErrPermissionDenied, time.Unix(exp, 0).UTC().Format(time.RFC3339))
	}
	return nil
}
