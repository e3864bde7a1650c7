package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// BuildStatus is the state of a template build, spelled as the E2B API
// spells it.
type BuildStatus string

// Build statuses.
const (
	BuildWaiting  BuildStatus = "waiting"
	BuildBuilding BuildStatus = "building"
	BuildReady    BuildStatus = "ready"
	BuildError    BuildStatus = "error"
)

// Terminal reports whether no further transition follows s.
func (s BuildStatus) Terminal() bool { return s == BuildReady || s == BuildError }

// TemplateBuild is one build of a template (internal/templatebuild owns the
// semantics; the store keeps the record).
type TemplateBuild struct {
	ID       string
	Template string
	Status   BuildStatus
	// Reason is the JSON failure reason; empty when none.
	Reason string
	// SandboxID is the build sandbox while one exists; empty otherwise.
	SandboxID string
	// Owner is the server process running the build (set when it
	// starts); it heartbeats UpdatedAt while the build runs.
	Owner      string
	CPUCount   int
	MemoryMB   int
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
}

// BuildLogEntry is one line of a build's log; Seq numbers the entries of a
// build from 0.
type BuildLogEntry struct {
	Seq     int
	Time    time.Time
	Level   string
	Step    string
	Message string
}

const buildColumns = `id, template, status, reason, sandbox_id, owner, cpu_count, memory_mb, created_at, updated_at, finished_at`

func scanBuild(r rowScanner) (TemplateBuild, error) {
	var (
		b                TemplateBuild
		status           string
		created, updated int64
		finished         sql.NullInt64
	)
	if err := r.Scan(&b.ID, &b.Template, &status, &b.Reason, &b.SandboxID, &b.Owner, &b.CPUCount, &b.MemoryMB, &created, &updated, &finished); err != nil {
		return TemplateBuild{}, err
	}
	b.Status, b.CreatedAt, b.UpdatedAt, b.FinishedAt = BuildStatus(status), fromNanos(created), fromNanos(updated), nullNanos(finished)
	return b, nil
}

// CreateTemplateBuild inserts a build record (its status is normally
// BuildWaiting); ErrAlreadyExists if the id is taken.
func (s *sqlStore) CreateTemplateBuild(ctx context.Context, b TemplateBuild) error {
	now := toNanos(s.now())
	res, err := s.db.ExecContext(ctx, s.d.bind(`INSERT INTO template_builds (id, template, status, reason, sandbox_id, cpu_count, memory_mb, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`),
		b.ID, b.Template, string(b.Status), b.Reason, b.SandboxID, b.CPUCount, b.MemoryMB, now, now)
	if err != nil {
		return fmt.Errorf("create template build %s: %w", b.ID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("create template build %s: %w", b.ID, err)
	} else if n == 0 {
		return fmt.Errorf("create template build %s: %w", b.ID, errdefs.ErrAlreadyExists)
	}
	return nil
}

// GetTemplateBuild returns the build with id; ErrNotFound if unknown.
func (s *sqlStore) GetTemplateBuild(ctx context.Context, id string) (TemplateBuild, error) {
	b, err := scanBuild(s.db.QueryRowContext(ctx, s.d.bind(`SELECT `+buildColumns+` FROM template_builds WHERE id = ?`), id))
	if err == sql.ErrNoRows {
		return TemplateBuild{}, fmt.Errorf("template build %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return TemplateBuild{}, fmt.Errorf("get template build %s: %w", id, err)
	}
	return b, nil
}

// ListTemplateBuilds returns the builds of template (every build when
// template is empty), oldest first.
func (s *sqlStore) ListTemplateBuilds(ctx context.Context, template string) ([]TemplateBuild, error) {
	q, args := `SELECT `+buildColumns+` FROM template_builds`, []any{}
	if template != "" {
		q, args = q+` WHERE template = ?`, append(args, template)
	}
	return s.queryBuilds(ctx, "list template builds", q+` ORDER BY created_at, id`, args...)
}

// UnfinishedTemplateBuilds returns the builds still waiting or building.
func (s *sqlStore) UnfinishedTemplateBuilds(ctx context.Context) ([]TemplateBuild, error) {
	return s.queryBuilds(ctx, "list unfinished template builds",
		`SELECT `+buildColumns+` FROM template_builds WHERE status IN (?, ?) ORDER BY created_at, id`,
		string(BuildWaiting), string(BuildBuilding))
}

func (s *sqlStore) queryBuilds(ctx context.Context, what, query string, args ...any) ([]TemplateBuild, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(query), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	out := []TemplateBuild{}
	for rows.Next() {
		b, err := scanBuild(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// StartTemplateBuild moves a waiting build to building, run by owner. A
// build that is not waiting (started twice, or already finished) is
// ErrConflict; an unknown one ErrNotFound.
func (s *sqlStore) StartTemplateBuild(ctx context.Context, id, owner string) error {
	res, err := s.db.ExecContext(ctx, s.d.bind(`UPDATE template_builds SET status = ?, owner = ?, updated_at = ? WHERE id = ? AND status = ?`),
		string(BuildBuilding), owner, toNanos(s.now()), id, string(BuildWaiting))
	if err != nil {
		return fmt.Errorf("start template build %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("start template build %s: %w", id, err)
	} else if n == 1 {
		return nil
	}
	b, err := s.GetTemplateBuild(ctx, id)
	if err != nil {
		return err
	}
	return fmt.Errorf("start template build %s: %w: it is %s, not waiting", id, errdefs.ErrConflict, b.Status)
}

// HeartbeatTemplateBuild marks the build alive (updated_at = at, the
// owner's clock, which is also the clock that judges staleness) while
// owner runs it. It reports false when the build is no longer building
// under owner (another replica failed it as stale, or it ended): the owner
// should stop running it.
func (s *sqlStore) HeartbeatTemplateBuild(ctx context.Context, id, owner string, at time.Time) (bool, error) {
	res, err := s.db.ExecContext(ctx, s.d.bind(`UPDATE template_builds SET updated_at = ? WHERE id = ? AND owner = ? AND status = ?`),
		toNanos(at), id, owner, string(BuildBuilding))
	if err != nil {
		return false, fmt.Errorf("heartbeat template build %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("heartbeat template build %s: %w", id, err)
	}
	return n == 1, nil
}

// FailStaleTemplateBuild fails a build that is still unfinished and was
// last updated before staleBefore (its owner stopped heartbeating). It
// reports whether this call failed it: of replicas racing, one wins, and a
// build whose owner heartbeat meanwhile is left alone.
func (s *sqlStore) FailStaleTemplateBuild(ctx context.Context, id string, staleBefore time.Time, reason string) (bool, error) {
	now := toNanos(s.now())
	res, err := s.db.ExecContext(ctx, s.d.bind(`UPDATE template_builds SET status = ?, reason = ?, updated_at = ?, finished_at = ?
		WHERE id = ? AND status IN (?, ?) AND updated_at < ?`),
		string(BuildError), reason, now, now, id, string(BuildWaiting), string(BuildBuilding), toNanos(staleBefore))
	if err != nil {
		return false, fmt.Errorf("fail stale template build %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("fail stale template build %s: %w", id, err)
	}
	return n == 1, nil
}

// SetTemplateBuildSandbox records the build sandbox of a build ("" = none).
func (s *sqlStore) SetTemplateBuildSandbox(ctx context.Context, id, sandboxID string) error {
	return s.execOne(ctx, "set sandbox of template build "+id,
		`UPDATE template_builds SET sandbox_id = ?, updated_at = ? WHERE id = ?`, sandboxID, toNanos(s.now()), id)
}

// FinishTemplateBuild sets a terminal status and reason on a build that is
// not finished yet. It reports false (and changes nothing) when the build is
// already finished, so a late writer never overwrites the first outcome.
func (s *sqlStore) FinishTemplateBuild(ctx context.Context, id string, status BuildStatus, reason string) (bool, error) {
	if !status.Terminal() {
		return false, fmt.Errorf("finish template build %s: %w: status %q is not terminal", id, errdefs.ErrInvalidArgument, status)
	}
	now := toNanos(s.now())
	res, err := s.db.ExecContext(ctx, s.d.bind(`UPDATE template_builds SET status = ?, reason = ?, updated_at = ?, finished_at = ?
		WHERE id = ? AND status IN (?, ?)`),
		string(status), reason, now, now, id, string(BuildWaiting), string(BuildBuilding))
	if err != nil {
		return false, fmt.Errorf("finish template build %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("finish template build %s: %w", id, err)
	}
	if n == 0 {
		if _, err := s.GetTemplateBuild(ctx, id); err != nil {
			return false, err
		}
	}
	return n == 1, nil
}

// DeleteTemplateBuilds removes every build of template with its logs.
func (s *sqlStore) DeleteTemplateBuilds(ctx context.Context, template string) error {
	// Logs first: ON DELETE CASCADE needs foreign keys enabled, which a
	// PostgreSQL database always has but a foreign SQLite connection may not.
	if _, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM template_build_logs WHERE build_id IN (SELECT id FROM template_builds WHERE template = ?)`), template); err != nil {
		return fmt.Errorf("delete builds of template %s: %w", template, err)
	}
	if _, err := s.db.ExecContext(ctx, s.d.bind(`DELETE FROM template_builds WHERE template = ?`), template); err != nil {
		return fmt.Errorf("delete builds of template %s: %w", template, err)
	}
	return nil
}

// AppendTemplateBuildLogs stores entries as the build's log lines
// first, first+1, ...; the caller (the build's only writer) numbers them.
func (s *sqlStore) AppendTemplateBuildLogs(ctx context.Context, buildID string, first int, entries []BuildLogEntry) (err error) {
	if len(entries) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append logs of template build %s: %w", buildID, err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	stmt, err := tx.PrepareContext(ctx, s.d.bind(`INSERT INTO template_build_logs (build_id, seq, ts, level, step, message) VALUES (?, ?, ?, ?, ?, ?)`))
	if err != nil {
		return fmt.Errorf("append logs of template build %s: %w", buildID, err)
	}
	defer stmt.Close()
	for i, e := range entries {
		if _, err := stmt.ExecContext(ctx, buildID, first+i, toNanos(e.Time), e.Level, e.Step, e.Message); err != nil {
			return fmt.Errorf("append logs of template build %s: %w", buildID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append logs of template build %s: %w", buildID, err)
	}
	return nil
}

// TemplateBuildLogs returns at most limit log entries of a build from seq
// offset on, in order; never nil.
func (s *sqlStore) TemplateBuildLogs(ctx context.Context, buildID string, offset, limit int) ([]BuildLogEntry, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(`SELECT seq, ts, level, step, message FROM template_build_logs
		WHERE build_id = ? AND seq >= ? ORDER BY seq LIMIT ?`), buildID, offset, limit)
	if err != nil {
		return nil, fmt.Errorf("logs of template build %s: %w", buildID, err)
	}
	defer rows.Close()
	out := []BuildLogEntry{}
	for rows.Next() {
		var (
			e  BuildLogEntry
			ts int64
		)
		if err := rows.Scan(&e.Seq, &ts, &e.Level, &e.Step, &e.Message); err != nil {
			return nil, fmt.Errorf("logs of template build %s: %w", buildID, err)
		}
		e.Time = fromNanos(ts)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("logs of template build %s: %w", buildID, err)
	}
	return out, nil
}

// TemplateBuildLogCount returns the number of log entries of a build.
func (s *sqlStore) TemplateBuildLogCount(ctx context.Context, buildID string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, s.d.bind(`SELECT COUNT(*) FROM template_build_logs WHERE build_id = ?`), buildID).Scan(&n); err != nil {
		return 0, fmt.Errorf("count logs of template build %s: %w", buildID, err)
	}
	return n, nil
}
