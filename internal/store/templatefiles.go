package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// TemplateFileChunkSize is the size of the rows an uploaded template file
// is cut into: a write or read holds one chunk in memory, never the file.
const TemplateFileChunkSize = 1 << 20

// PutTemplateFile stores the bytes of r as the template file hash, unless
// a file of that hash is stored already: the first complete write wins, and
// stored reports whether this call's did. The chunks are written one
// statement each (no transaction holds the database while a large file is
// copied); the file becomes visible only when its template_files row is
// inserted after its last chunk. A write cut short leaves chunks no row
// names, which DeleteUnusedTemplateFiles removes.
func (s *sqlStore) PutTemplateFile(ctx context.Context, hash string, r io.Reader) (stored bool, err error) {
	if present, err := s.hasTemplateFile(ctx, hash); err != nil || present {
		return false, err
	}
	uploadID := randomID()
	defer func() {
		if !stored {
			// Best effort: what is left is an orphan the collector removes.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = s.db.ExecContext(dctx, s.d.bind(`DELETE FROM template_file_chunks WHERE upload_id = ?`), uploadID)
		}
	}()
	buf := make([]byte, TemplateFileChunkSize)
	var size int64
	seq := 0
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if _, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO template_file_chunks (upload_id, seq, data, created_at) VALUES (?, ?, ?, ?)`),
				uploadID, seq, buf[:n], toNanos(s.now())); err != nil {
				return false, fmt.Errorf("store template file %s: %w", hash, err)
			}
			seq++
			size += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return false, fmt.Errorf("store template file %s: read: %w", hash, rerr)
		}
	}
	now := toNanos(s.now())
	res, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO template_files (hash, upload_id, size, chunks, created_at, used_at)
		VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING`), hash, uploadID, size, seq, now, now)
	if err != nil {
		return false, fmt.Errorf("store template file %s: %w", hash, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("store template file %s: %w", hash, err)
	}
	return n == 1, nil
}

func (s *sqlStore) hasTemplateFile(ctx context.Context, hash string) (bool, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, s.d.bind(`SELECT COUNT(*) FROM template_files WHERE hash = ?`), hash).Scan(&n); err != nil {
		return false, fmt.Errorf("look up template file %s: %w", hash, err)
	}
	return n > 0, nil
}

// TouchTemplateFile reports whether the template file hash is stored and,
// if so, marks it used now, which keeps it from DeleteUnusedTemplateFiles.
func (s *sqlStore) TouchTemplateFile(ctx context.Context, hash string) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.d.bind(`UPDATE template_files SET used_at = ? WHERE hash = ?`), toNanos(s.now()), hash)
	if err != nil {
		return false, fmt.Errorf("touch template file %s: %w", hash, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("touch template file %s: %w", hash, err)
	}
	return n > 0, nil
}

// OpenTemplateFile returns a reader of the template file hash; ErrNotFound
// when none is stored. It reads one chunk per query, under ctx, so no
// connection or transaction stays held between reads.
func (s *sqlStore) OpenTemplateFile(ctx context.Context, hash string) (io.ReadCloser, error) {
	var (
		f    = &fileReader{ctx: ctx, s: s, hash: hash}
		size int64
	)
	err := s.db.QueryRowContext(ctx, s.d.bind(`SELECT upload_id, chunks, size FROM template_files WHERE hash = ?`), hash).Scan(&f.uploadID, &f.chunks, &size)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("template file %s: %w", hash, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("open template file %s: %w", hash, err)
	}
	return f, nil
}

// fileReader reads a stored template file chunk by chunk.
type fileReader struct {
	ctx      context.Context // the OpenTemplateFile call's: an io.Reader has none of its own
	s        *sqlStore
	hash     string
	uploadID string
	chunks   int
	next     int
	cur      bytes.Reader
}

func (f *fileReader) Read(p []byte) (int, error) {
	for f.cur.Len() == 0 {
		if f.next >= f.chunks {
			return 0, io.EOF
		}
		var data []byte
		err := f.s.db.QueryRowContext(f.ctx, f.s.d.bind(`SELECT data FROM template_file_chunks WHERE upload_id = ? AND seq = ?`),
			f.uploadID, f.next).Scan(&data)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("read template file %s: chunk %d: %w (collected while read?)", f.hash, f.next, errdefs.ErrNotFound)
		}
		if err != nil {
			return 0, fmt.Errorf("read template file %s: %w", f.hash, err)
		}
		f.cur.Reset(data)
		f.next++
	}
	return f.cur.Read(p)
}

func (f *fileReader) Close() error { return nil }

// DeleteUnusedTemplateFiles removes the template files last used before
// usedBefore, and the chunks of writes that never completed, older than
// orphansBefore. It returns the removed hashes. Each removal is
// conditional on the file still being unused, so replicas may run it at
// once and a file touched meanwhile stays.
func (s *sqlStore) DeleteUnusedTemplateFiles(ctx context.Context, usedBefore, orphansBefore time.Time) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(`SELECT hash, upload_id FROM template_files WHERE used_at < ? ORDER BY hash`), toNanos(usedBefore))
	if err != nil {
		return nil, fmt.Errorf("list unused template files: %w", err)
	}
	type file struct{ hash, upload string }
	var candidates []file
	for rows.Next() {
		var f file
		if err := rows.Scan(&f.hash, &f.upload); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list unused template files: %w", err)
		}
		candidates = append(candidates, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list unused template files: %w", err)
	}
	var (
		out  []string
		errs []error
	)
	for _, f := range candidates {
		res, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM template_files WHERE hash = ? AND upload_id = ? AND used_at < ?`),
			f.hash, f.upload, toNanos(usedBefore))
		if err != nil {
			errs = append(errs, fmt.Errorf("delete template file %s: %w", f.hash, err))
			continue
		}
		if n, _ := res.RowsAffected(); n == 0 {
			continue // used meanwhile, or removed by another replica
		}
		out = append(out, f.hash)
	}
	// Chunks no file names: the files just removed, and writes cut short
	// (old enough that they are not in progress).
	if _, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM template_file_chunks
		WHERE upload_id NOT IN (SELECT upload_id FROM template_files) AND created_at < ?`), toNanos(orphansBefore)); err != nil {
		errs = append(errs, fmt.Errorf("delete orphan template file chunks: %w", err))
	}
	return out, errors.Join(errs...)
}

// SharedSecret returns the secret called name that every replica of this
// store shares, making it from candidate when there is none yet: the first
// writer wins and later callers get its value.
func (s *sqlStore) SharedSecret(ctx context.Context, name string, candidate []byte) ([]byte, error) {
	if len(candidate) == 0 {
		return nil, fmt.Errorf("shared secret %s: %w: empty candidate", name, errdefs.ErrInvalidArgument)
	}
	if _, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO cube_secrets (name, value, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`),
		name, candidate, toNanos(s.now())); err != nil {
		return nil, fmt.Errorf("shared secret %s: %w", name, err)
	}
	var v []byte
	if err := s.db.QueryRowContext(ctx, s.d.bind(`SELECT value FROM cube_secrets WHERE name = ?`), name).Scan(&v); err != nil {
		return nil, fmt.Errorf("shared secret %s: %w", name, err)
	}
	return v, nil
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
