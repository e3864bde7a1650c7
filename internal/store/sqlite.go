package store

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// SQLite is the embedded control-plane store (one server replica).
type SQLite struct {
	sqlStore
}

// OpenSQLite opens (creating if needed) the database at path, enables WAL,
// a busy timeout and foreign keys, and applies pending migrations. It refuses
// a database whose schema is newer than this binary knows.
func OpenSQLite(ctx context.Context, path string) (*SQLite, error) {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Set("_txlock", "immediate")
	dsn := "file:" + path + "?" + q.Encode()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	db.SetMaxOpenConns(8)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w: %w", path, errdefs.ErrUnavailable, err)
	}
	if err := migrate(ctx, db, sqliteDialect); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	return &SQLite{sqlStore{db: db, d: sqliteDialect, now: time.Now}}, nil
}
