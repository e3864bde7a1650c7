package store

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/cube-dev/cube/internal/errdefs"
)

// PostgreSQL is the control-plane store for several server replicas. It has
// the same schema, migrations and methods as SQLite. Every write is one
// statement or one transaction, and creates rely on unique constraints
// (INSERT ... ON CONFLICT), so replicas writing at once cannot create a
// record twice or lose one.
type PostgreSQL struct {
	sqlStore
}

// PostgreSQL pool bounds; a replica needs few connections since every
// request holds one only for a statement or a short transaction.
const (
	pgMaxOpenConns = 16
	pgMaxIdleConns = 4
)

// OpenPostgreSQL connects to the database named by dsn (a postgres:// URL or
// a libpq key=value string), applies pending migrations (serialised between
// replicas by an advisory lock) and refuses a schema newer than this binary
// knows. The database must exist.
func OpenPostgreSQL(ctx context.Context, dsn string) (*PostgreSQL, error) {
	where := redactDSN(dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgresql %s: %w: %w", where, errdefs.ErrInvalidArgument, err)
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		cfg.RuntimeParams["application_name"] = "cube-server"
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(pgMaxOpenConns)
	db.SetMaxIdleConns(pgMaxIdleConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open postgresql %s: %w: %w", where, errdefs.ErrUnavailable, err)
	}
	if err := migrate(ctx, db, postgresDialect); err != nil {
		db.Close()
		return nil, fmt.Errorf("open postgresql %s: %w", where, err)
	}
	return &PostgreSQL{sqlStore{db: newTimedDB(db, nil), d: postgresDialect, now: time.Now}}, nil
}

// redactDSN returns dsn fit for an error message: a URL without its
// password, or a placeholder for key=value strings (which may hold one).
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return "(key=value dsn)"
	}
	return u.Redacted()
}
