package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// PutTemplateFile stores the bytes of r as the template file hash, unless
// a file of that hash is stored already (then r is not read): the first
// complete write wins, and stored reports whether this call's did. The
// chunks are written one statement each (no transaction holds the database
// while a large file is copied); the file becomes visible only when its
// template_files row is inserted after its last chunk. A write cut short
// leaves chunks no row names, which DeleteUnusedTemplateFiles removes.
func (s *sqlStore) PutTemplateFile(ctx context.Context, hash string, r io.Reader) (stored bool, err error) {
	if present, err := s.hasBlob(ctx, templateFileTables, hash); err != nil || present {
		return false, err
	}
	return s.putBlob(ctx, templateFileTables, hash, r)
}

// TouchTemplateFile reports whether the template file hash is stored and,
// if so, marks it used now, which keeps it from DeleteUnusedTemplateFiles.
func (s *sqlStore) TouchTemplateFile(ctx context.Context, hash string) (bool, error) {
	return s.touchBlob(ctx, templateFileTables, hash)
}

// OpenTemplateFile returns a reader of the template file hash; ErrNotFound
// when none is stored. It reads one chunk per query, under ctx, so no
// connection or transaction stays held between reads.
func (s *sqlStore) OpenTemplateFile(ctx context.Context, hash string) (io.ReadCloser, error) {
	r, _, err := s.openBlob(ctx, templateFileTables, hash)
	return r, err
}

// DeleteUnusedTemplateFiles removes the template files last used before
// usedBefore, and the chunks of writes that never completed, untouched
// since orphansBefore. It returns the removed hashes. Each removal is
// conditional on the file still being unused, so replicas may run it at
// once and a file touched meanwhile stays.
func (s *sqlStore) DeleteUnusedTemplateFiles(ctx context.Context, usedBefore, orphansBefore time.Time) ([]string, error) {
	out, err := s.deleteBlobs(ctx, templateFileTables, `used_at < ?`, toNanos(usedBefore))
	return out, errors.Join(err, s.deleteOrphanChunks(ctx, templateFileTables, orphansBefore))
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
