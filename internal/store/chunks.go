package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// ChunkSize is the size of the rows a stored blob (an uploaded template
// file, a layer) is cut into: a write or read holds one chunk in memory,
// never the blob.
const ChunkSize = 1 << 20

// TemplateFileChunkSize is the chunk size of template files.
const TemplateFileChunkSize = ChunkSize

// blobTables names one family of chunked blobs: a table of complete blobs,
// keyed by a hash or digest, with columns (key, upload_id, size, chunks,
// created_at, used_at), and a table of chunks (upload_id, seq, data,
// created_at). A write puts its chunks under a fresh upload id, one
// statement each (no transaction holds the database while a large blob is
// copied), then inserts the blob row naming that upload id: the blob is
// visible only once complete, and of concurrent writers of one key the
// first to insert its row wins. Table and column names are constants of
// this package, never input.
type blobTables struct {
	what   string // "template file", "layer": for error messages
	table  string // table of complete blobs
	key    string // its key column
	chunks string // table of chunks
}

var (
	templateFileTables = blobTables{what: "template file", table: "template_files", key: "hash", chunks: "template_file_chunks"}
	layerTables        = blobTables{what: "layer", table: "layers", key: "digest", chunks: "layer_chunks"}
)

// putBlob stores the bytes of r as blob key unless one is stored already
// (stored reports whether this call's write became the blob). Chunks of a
// write that fails or loses the race are removed (best effort: what stays
// is an orphan that deleteOrphanChunks removes).
func (s *sqlStore) putBlob(ctx context.Context, b blobTables, key string, r io.Reader) (stored bool, err error) {
	uploadID := randomID()
	defer func() {
		if !stored {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = s.db.ExecContext(dctx, s.d.bind(`DELETE FROM `+b.chunks+` WHERE upload_id = ?`), uploadID)
		}
	}()
	buf := make([]byte, ChunkSize)
	var size int64
	seq := 0
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if _, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO `+b.chunks+` (upload_id, seq, data, created_at) VALUES (?, ?, ?, ?)`),
				uploadID, seq, buf[:n], toNanos(s.now())); err != nil {
				return false, fmt.Errorf("store %s %s: %w", b.what, key, err)
			}
			seq++
			size += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return false, fmt.Errorf("store %s %s: read: %w", b.what, key, rerr)
		}
	}
	now := toNanos(s.now())
	res, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO `+b.table+` (`+b.key+`, upload_id, size, chunks, created_at, used_at)
		VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (`+b.key+`) DO NOTHING`), key, uploadID, size, seq, now, now)
	if err != nil {
		return false, fmt.Errorf("store %s %s: %w", b.what, key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store %s %s: %w", b.what, key, err)
	}
	return n == 1, nil
}

// hasBlob reports whether blob key is stored (complete).
func (s *sqlStore) hasBlob(ctx context.Context, b blobTables, key string) (bool, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, s.d.bind(`SELECT COUNT(*) FROM `+b.table+` WHERE `+b.key+` = ?`), key).Scan(&n); err != nil {
		return false, fmt.Errorf("look up %s %s: %w", b.what, key, err)
	}
	return n > 0, nil
}

// touchBlob marks blob key used now and reports whether it is stored.
func (s *sqlStore) touchBlob(ctx context.Context, b blobTables, key string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.d.bind(`UPDATE `+b.table+` SET used_at = ? WHERE `+b.key+` = ?`), toNanos(s.now()), key)
	if err != nil {
		return false, fmt.Errorf("touch %s %s: %w", b.what, key, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("touch %s %s: %w", b.what, key, err)
	}
	return n > 0, nil
}

// openBlob returns a reader of blob key and its size; ErrNotFound when
// none is stored. The reader reads one chunk per query, under ctx, so no
// connection or transaction stays held between reads.
func (s *sqlStore) openBlob(ctx context.Context, b blobTables, key string) (io.ReadCloser, int64, error) {
	var (
		f    = &blobReader{ctx: ctx, s: s, b: b, key: key}
		size int64
	)
	err := s.db.QueryRowContext(ctx, s.d.bind(`SELECT upload_id, chunks, size FROM `+b.table+` WHERE `+b.key+` = ?`), key).Scan(&f.uploadID, &f.chunks, &size)
	if isNoRows(err) {
		return nil, 0, fmt.Errorf("%s %s: %w", b.what, key, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("open %s %s: %w", b.what, key, err)
	}
	return f, size, nil
}

// blobReader reads a stored blob chunk by chunk.
type blobReader struct {
	ctx      context.Context // the open call's: an io.Reader has none of its own
	s        *sqlStore
	b        blobTables
	key      string
	uploadID string
	chunks   int
	next     int
	cur      bytes.Reader
}

func (f *blobReader) Read(p []byte) (int, error) {
	for f.cur.Len() == 0 {
		if f.next >= f.chunks {
			return 0, io.EOF
		}
		var data []byte
		err := f.s.db.QueryRowContext(f.ctx, f.s.d.bind(`SELECT data FROM `+f.b.chunks+` WHERE upload_id = ? AND seq = ?`),
			f.uploadID, f.next).Scan(&data)
		if isNoRows(err) {
			return 0, fmt.Errorf("read %s %s: chunk %d: %w (collected while read?)", f.b.what, f.key, f.next, errdefs.ErrNotFound)
		}
		if err != nil {
			return 0, fmt.Errorf("read %s %s: %w", f.b.what, f.key, err)
		}
		f.cur.Reset(data)
		f.next++
	}
	return f.cur.Read(p)
}

func (f *blobReader) Close() error { return nil }

// deleteBlobs removes the blobs whose row matches cond (a condition on the
// blob table's columns, with args) and their chunks, each removal
// conditional on cond still holding, so replicas may run it at once and a
// blob used meanwhile stays. It returns the removed keys, sorted.
func (s *sqlStore) deleteBlobs(ctx context.Context, b blobTables, cond string, args ...any) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(`SELECT `+b.key+`, upload_id FROM `+b.table+` WHERE `+cond+` ORDER BY `+b.key), args...)
	if err != nil {
		return nil, fmt.Errorf("list unused %ss: %w", b.what, err)
	}
	type blob struct{ key, upload string }
	var candidates []blob
	for rows.Next() {
		var f blob
		if err := rows.Scan(&f.key, &f.upload); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list unused %ss: %w", b.what, err)
		}
		candidates = append(candidates, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list unused %ss: %w", b.what, err)
	}
	var (
		out  []string
		errs []error
	)
	for _, f := range candidates {
		res, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM `+b.table+` WHERE `+b.key+` = ? AND upload_id = ? AND `+cond),
			append([]any{f.key, f.upload}, args...)...)
		if err != nil {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", b.what, f.key, err))
			continue
		}
		if n, _ := res.RowsAffected(); n == 0 {
			continue // used meanwhile, or removed by another replica
		}
		out = append(out, f.key)
		// The upload id is this write's alone: its chunks go with it.
		if _, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM `+b.chunks+` WHERE upload_id = ?`), f.upload); err != nil {
			errs = append(errs, fmt.Errorf("delete chunks of %s %s: %w", b.what, f.key, err))
		}
	}
	return out, errors.Join(errs...)
}

// deleteOrphanChunks removes the chunks no blob names (writes cut short, a
// deleteBlobs that failed half way) once no chunk of their upload was
// written since before, so a long write still in progress keeps its
// first chunks.
func (s *sqlStore) deleteOrphanChunks(ctx context.Context, b blobTables, before time.Time) error {
	if _, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM `+b.chunks+`
		WHERE upload_id NOT IN (SELECT upload_id FROM `+b.table+`)
		AND upload_id NOT IN (SELECT upload_id FROM `+b.chunks+` WHERE created_at >= ?)`), toNanos(before)); err != nil {
		return fmt.Errorf("delete orphan %s chunks: %w", b.what, err)
	}
	return nil
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
