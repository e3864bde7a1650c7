package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/cube-dev/cube/internal/errdefs"
)

// migrations are applied in order; migrations[i] brings the schema from
// version i to i+1. Never edit a released entry: append a new one. The same
// text runs on SQLite and PostgreSQL, so it sticks to the types and syntax
// both accept (TEXT, INTEGER, BIGINT, BOOLEAN, CHECK, ON DELETE CASCADE).
// Timestamps are BIGINT unix nanoseconds. Should a future step need
// engine-specific SQL, branch on the dialect here, in this one place.
var migrations = []string{
	// 1: sandboxes, their metadata index, api keys.
	`CREATE TABLE sandboxes (
		id                    TEXT PRIMARY KEY,
		template_id           TEXT NOT NULL,
		alias                 TEXT NOT NULL DEFAULT '',
		node_id               TEXT NOT NULL DEFAULT '',
		metadata              TEXT NOT NULL DEFAULT '{}',
		env_vars              TEXT NOT NULL DEFAULT '{}',
		started_at            BIGINT NOT NULL,
		end_at                BIGINT NOT NULL,
		state                 TEXT NOT NULL CHECK (state IN ('running', 'paused')),
		cpu_count             INTEGER NOT NULL,
		memory_mb             INTEGER NOT NULL,
		disk_size_mb          INTEGER NOT NULL,
		envd_version          TEXT NOT NULL,
		envd_access_token     TEXT NOT NULL,
		allow_internet_access BOOLEAN,
		network               TEXT,
		lifecycle             TEXT NOT NULL DEFAULT '{}'
	);
	CREATE INDEX sandboxes_started ON sandboxes (started_at, id);
	CREATE INDEX sandboxes_state_end ON sandboxes (state, end_at);
	CREATE TABLE sandbox_metadata (
		sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
		key        TEXT NOT NULL,
		value      TEXT NOT NULL,
		PRIMARY KEY (sandbox_id, key)
	);
	CREATE INDEX sandbox_metadata_kv ON sandbox_metadata (key, value);
	CREATE TABLE api_keys (
		id           TEXT PRIMARY KEY,
		name         TEXT NOT NULL,
		hash         TEXT NOT NULL UNIQUE,
		created_at   BIGINT NOT NULL,
		last_used_at BIGINT,
		revoked_at   BIGINT
	);`,
	// 2: cluster nodes (registration + operator state, as a JSON document).
	`CREATE TABLE nodes (
		id         TEXT PRIMARY KEY,
		data       TEXT NOT NULL,
		updated_at BIGINT NOT NULL
	);`,
	// 3: the traffic access token required on non-envd ports when a
	// sandbox's public traffic is disabled ('' = public).
	`ALTER TABLE sandboxes ADD COLUMN traffic_access_token TEXT NOT NULL DEFAULT '';`,
	// 4: a node's drain progress (phase, remaining sandboxes), written by
	// the replica that drives drains and read by every replica. A column of
	// its own, updated alone, so progress writes never race with the
	// read-modify-write of the registration document ('' = none).
	`ALTER TABLE nodes ADD COLUMN progress TEXT NOT NULL DEFAULT '';`,
	// 5: E2B template builds and their logs (internal/templatebuild).
	// reason is the JSON failure reason ('' = none); sandbox_id is the
	// build sandbox, recorded so a restarted server can kill it.
	`CREATE TABLE template_builds (
		id          TEXT PRIMARY KEY,
		template    TEXT NOT NULL,
		status      TEXT NOT NULL CHECK (status IN ('waiting', 'building', 'ready', 'error')),
		reason      TEXT NOT NULL DEFAULT '',
		sandbox_id  TEXT NOT NULL DEFAULT '',
		cpu_count   INTEGER NOT NULL DEFAULT 0,
		memory_mb   INTEGER NOT NULL DEFAULT 0,
		created_at  BIGINT NOT NULL,
		updated_at  BIGINT NOT NULL,
		finished_at BIGINT
	);
	CREATE INDEX template_builds_template ON template_builds (template, created_at);
	CREATE INDEX template_builds_status ON template_builds (status);
	CREATE TABLE template_build_logs (
		build_id TEXT NOT NULL REFERENCES template_builds (id) ON DELETE CASCADE,
		seq      INTEGER NOT NULL,
		ts       BIGINT NOT NULL,
		level    TEXT NOT NULL,
		step     TEXT NOT NULL DEFAULT '',
		message  TEXT NOT NULL,
		PRIMARY KEY (build_id, seq)
	);`,
	// 6: template builds across replicas (internal/templatebuild). owner
	// is the server process running a build; it heartbeats updated_at, and
	// any replica fails a build whose owner stopped. Uploaded COPY archives
	// live here rather than on one replica's disk: template_files maps a
	// files hash to one complete upload, whose bytes are the rows of
	// template_file_chunks (chunks so that no statement holds a whole
	// archive). cube_secrets holds keys replicas share (the upload URLs'
	// signing key), first writer wins. BYTEA is PostgreSQL's binary type;
	// SQLite accepts the name and stores blobs as they are.
	`ALTER TABLE template_builds ADD COLUMN owner TEXT NOT NULL DEFAULT '';
	CREATE TABLE template_files (
		hash       TEXT PRIMARY KEY,
		upload_id  TEXT NOT NULL,
		size       BIGINT NOT NULL,
		chunks     INTEGER NOT NULL,
		created_at BIGINT NOT NULL,
		used_at    BIGINT NOT NULL
	);
	CREATE TABLE template_file_chunks (
		upload_id  TEXT NOT NULL,
		seq        INTEGER NOT NULL,
		data       BYTEA NOT NULL,
		created_at BIGINT NOT NULL,
		PRIMARY KEY (upload_id, seq)
	);
	CREATE TABLE cube_secrets (
		name       TEXT PRIMARY KEY,
		value      BYTEA NOT NULL,
		created_at BIGINT NOT NULL
	);`,
	// 7: template tags (internal/templatebuild, tags.go). A row points
	// template:tag at a build and at the registry template holding that
	// build's result (target: the template's own name, or a per-build
	// template). template_build_tags keeps the tags a build gets once it is
	// ready, between the build request and its end.
	`CREATE TABLE template_tags (
		template   TEXT NOT NULL,
		tag        TEXT NOT NULL,
		build_id   TEXT NOT NULL DEFAULT '',
		target     TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		PRIMARY KEY (template, tag)
	);
	CREATE INDEX template_tags_target ON template_tags (target);
	CREATE TABLE template_build_tags (
		build_id TEXT NOT NULL,
		tag      TEXT NOT NULL,
		seq      INTEGER NOT NULL,
		PRIMARY KEY (build_id, tag)
	);`,
	// 8: layers and template records (layers.go, templaterecords.go).
	// layers are content-addressed by the caller's digest and stored as
	// template files are (a row per complete layer naming the upload whose
	// chunks hold its bytes; used_at is bumped by a repeated put and by a
	// record naming the layer, so the collector spares a layer being
	// recorded). template_records are templates any node can fetch; their
	// layer stacks are rows of template_record_layers, bottom first (seq
	// 0), indexed by digest for the collector's "is it referenced" check.
	// The created_at indexes let the collector find old orphan chunks
	// without reading the chunks themselves.
	`CREATE TABLE layers (
		digest     TEXT PRIMARY KEY,
		upload_id  TEXT NOT NULL,
		size       BIGINT NOT NULL,
		chunks     INTEGER NOT NULL,
		created_at BIGINT NOT NULL,
		used_at    BIGINT NOT NULL
	);
	CREATE TABLE layer_chunks (
		upload_id  TEXT NOT NULL,
		seq        INTEGER NOT NULL,
		data       BYTEA NOT NULL,
		created_at BIGINT NOT NULL,
		PRIMARY KEY (upload_id, seq)
	);
	CREATE INDEX layer_chunks_created ON layer_chunks (created_at, upload_id);
	CREATE INDEX template_file_chunks_created ON template_file_chunks (created_at, upload_id);
	CREATE TABLE template_records (
		name         TEXT PRIMARY KEY,
		digest       TEXT NOT NULL,
		base_name    TEXT NOT NULL DEFAULT '',
		cpu_count    INTEGER NOT NULL DEFAULT 0,
		memory_mb    INTEGER NOT NULL DEFAULT 0,
		disk_size_mb INTEGER NOT NULL DEFAULT 0,
		defaults     TEXT,
		node         TEXT NOT NULL DEFAULT '',
		created_at   BIGINT NOT NULL
	);
	CREATE TABLE template_record_layers (
		template TEXT NOT NULL REFERENCES template_records (name) ON DELETE CASCADE,
		seq      INTEGER NOT NULL,
		digest   TEXT NOT NULL,
		size     BIGINT NOT NULL DEFAULT 0,
		PRIMARY KEY (template, seq)
	);
	CREATE INDEX template_record_layers_digest ON template_record_layers (digest);`,
}

// LatestSchemaVersion is the schema version this binary writes.
var LatestSchemaVersion = len(migrations)

func schemaVersion(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if err == sql.ErrNoRows {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// migrate brings db to LatestSchemaVersion, one transaction per step. Each
// step first takes d.migrationLock, so replicas that start at once apply a
// step exactly once; the loser of the race finds the new version and moves on.
func migrate(ctx context.Context, db *sql.DB, d dialect) error {
	for {
		done, err := migrateStep(ctx, db, d)
		if err != nil || done {
			return err
		}
	}
}

func migrateStep(ctx context.Context, db *sql.DB, d dialect) (done bool, err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("begin migration: %w", err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if d.migrationLock != "" {
		if _, err := tx.ExecContext(ctx, d.migrationLock); err != nil {
			return false, fmt.Errorf("lock migrations: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return false, fmt.Errorf("create schema_version: %w", err)
	}
	v, err := schemaVersion(ctx, tx)
	if err != nil {
		return false, err
	}
	if v > len(migrations) {
		return false, fmt.Errorf("%w: database schema version %d is newer than this binary supports (%d); run a newer cube or restore a backup",
			errdefs.ErrFailedPrecondition, v, len(migrations))
	}
	if v == len(migrations) {
		return true, tx.Commit()
	}
	if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
		return false, fmt.Errorf("apply migration %d: %w", v+1, err)
	}
	if v == 0 {
		_, err = tx.ExecContext(ctx, d.bind(`INSERT INTO schema_version (version) VALUES (?)`), v+1)
	} else {
		_, err = tx.ExecContext(ctx, d.bind(`UPDATE schema_version SET version = ?`), v+1)
	}
	if err != nil {
		return false, fmt.Errorf("record schema version %d: %w", v+1, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("commit migration %d: %w", v+1, err)
	}
	return false, nil
}
