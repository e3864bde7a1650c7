package store

import (
	"context"
	"database/sql"
	"time"
)

// sqlStore is the implementation SQLite and PostgreSQL share: the same
// schema and queries over database/sql, with the dialect's differences
// applied by d.
type sqlStore struct {
	db  *timedDB // statements timed for cube_store_query_duration_seconds (metrics.go)
	d   dialect
	now func() time.Time
}

// Close releases the database.
func (s *sqlStore) Close() error { return s.db.Close() }

// SchemaVersion returns the schema version recorded in the database.
func (s *sqlStore) SchemaVersion(ctx context.Context) (int, error) {
	return schemaVersion(ctx, s.db)
}

func toNanos(t time.Time) int64 { return t.UnixNano() }

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

func nullNanos(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromNanos(n.Int64)
	return &t
}
