package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
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
	// All of them stay open: database/sql keeps 2 idle by default, and
	// under a burst a connection closed and reopened costs its start-up
	// pragmas each time.
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := pingSQLite(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w: %w", path, errdefs.ErrUnavailable, err)
	}
	if err := migrate(ctx, db, sqliteDialect); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	return &SQLite{sqlStore{db: newTimedDB(db, newWriteGate()), d: sqliteDialect, now: time.Now}}, nil
}

// pingSQLite opens the first connection, retrying while the database is
// locked: a connection's start-up pragmas (journal_mode=WAL on a fresh
// file) need a lock that SQLite refuses at once, without waiting out the
// busy timeout, when another process or replica opens the same file at the
// same moment (its deadlock avoidance).
func pingSQLite(ctx context.Context, db *sql.DB) error {
	deadline := time.Now().Add(10 * time.Second)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 200*time.Millisecond) {
		err := db.PingContext(ctx)
		if err == nil || !isSQLiteBusy(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// isSQLiteBusy reports SQLITE_BUSY (5) or SQLITE_LOCKED (6).
func isSQLiteBusy(err error) bool {
	var coded interface{ Code() int }
	if errors.As(err, &coded) {
		c := coded.Code() & 0xff // extended codes keep the primary in the low byte
		return c == 5 || c == 6
	}
	return strings.Contains(err.Error(), "SQLITE_BUSY") || strings.Contains(err.Error(), "database is locked")
}
