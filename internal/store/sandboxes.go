package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

const sandboxColumns = `id, template_id, alias, node_id, metadata, env_vars, started_at, end_at, state,
	cpu_count, memory_mb, disk_size_mb, envd_version, envd_access_token, allow_internet_access, network, lifecycle, traffic_access_token`

type rowScanner interface{ Scan(dest ...any) error }

func scanSandbox(r rowScanner) (Sandbox, error) {
	var (
		sb                   Sandbox
		meta, env, lifecycle string
		started, end         int64
		state                string
		allow                sql.NullBool
		network              sql.NullString
	)
	err := r.Scan(&sb.ID, &sb.TemplateID, &sb.Alias, &sb.NodeID, &meta, &env, &started, &end, &state,
		&sb.CPUCount, &sb.MemoryMB, &sb.DiskSizeMB, &sb.EnvdVersion, &sb.EnvdAccessToken, &allow, &network, &lifecycle, &sb.TrafficAccessToken)
	if err != nil {
		return Sandbox{}, err
	}
	sb.StartedAt, sb.EndAt, sb.State = fromNanos(started), fromNanos(end), State(state)
	if allow.Valid {
		sb.AllowInternetAccess = &allow.Bool
	}
	if network.Valid && network.String != "" {
		sb.Network = json.RawMessage(network.String)
	}
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: decode metadata: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sb.EnvVars); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: decode env vars: %w", sb.ID, err)
	}
	if err := json.Unmarshal([]byte(lifecycle), &sb.Lifecycle); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: decode lifecycle: %w", sb.ID, err)
	}
	return sb, nil
}

func jsonText(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// CreateSandbox inserts a new record; ErrAlreadyExists if the id is taken.
func (s *sqlStore) CreateSandbox(ctx context.Context, sb Sandbox) (err error) {
	if !sb.State.Valid() {
		return fmt.Errorf("create sandbox %s: %w: state %q", sb.ID, errdefs.ErrInvalidArgument, sb.State)
	}
	meta, env, lifecycle := sb.Metadata, sb.EnvVars, sb.Lifecycle
	if meta == nil {
		meta = map[string]string{}
	}
	if env == nil {
		env = map[string]string{}
	}
	metaText, err := jsonText(meta)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	envText, err := jsonText(env)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	lcText, err := jsonText(lifecycle)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	var network sql.NullString
	if len(sb.Network) > 0 {
		network = sql.NullString{String: string(sb.Network), Valid: true}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	// ON CONFLICT DO NOTHING instead of SELECT-then-INSERT: with two server
	// replicas on PostgreSQL the loser of a race sees zero rows, not an error.
	res, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO sandboxes (`+sandboxColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`),
		sb.ID, sb.TemplateID, sb.Alias, sb.NodeID, metaText, envText, toNanos(sb.StartedAt), toNanos(sb.EndAt), string(sb.State),
		sb.CPUCount, sb.MemoryMB, sb.DiskSizeMB, sb.EnvdVersion, sb.EnvdAccessToken, sb.AllowInternetAccess, network, lcText, sb.TrafficAccessToken)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, errdefs.ErrAlreadyExists)
	}
	for k, v := range meta {
		if _, err = tx.ExecContext(ctx, s.d.bind(`INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES (?, ?, ?)`), sb.ID, k, v); err != nil {
			return fmt.Errorf("create sandbox %s: metadata: %w", sb.ID, err)
		}
	}
	if err = tx.Commit(); err != nil {
		return fmt.Errorf("create sandbox %s: commit: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox returns one record; ErrNotFound if unknown.
func (s *sqlStore) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	row := s.db.QueryRowContext(ctx, s.d.bind(`SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`), id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// DeleteSandbox removes a record (and its metadata); ErrNotFound if unknown.
func (s *sqlStore) DeleteSandbox(ctx context.Context, id string) error {
	return s.execOne(ctx, "delete sandbox "+id, `DELETE FROM sandboxes WHERE id = ?`, id)
}

// SetEndAt changes a sandbox's end time; ErrNotFound if unknown.
func (s *sqlStore) SetEndAt(ctx context.Context, id string, endAt time.Time) error {
	return s.execOne(ctx, "set end of sandbox "+id, `UPDATE sandboxes SET end_at = ? WHERE id = ?`, toNanos(endAt), id)
}

// SetState changes a sandbox's state and end time; ErrNotFound if unknown.
func (s *sqlStore) SetState(ctx context.Context, id string, state State, endAt time.Time) error {
	if !state.Valid() {
		return fmt.Errorf("set state of sandbox %s: %w: state %q", id, errdefs.ErrInvalidArgument, state)
	}
	return s.execOne(ctx, "set state of sandbox "+id, `UPDATE sandboxes SET state = ?, end_at = ? WHERE id = ?`,
		string(state), toNanos(endAt), id)
}

// SetNetwork replaces a sandbox's network configuration; ErrNotFound if unknown.
func (s *sqlStore) SetNetwork(ctx context.Context, id string, network json.RawMessage, allowInternet *bool) error {
	var n sql.NullString
	if len(network) > 0 {
		n = sql.NullString{String: string(network), Valid: true}
	}
	return s.execOne(ctx, "set network of sandbox "+id,
		`UPDATE sandboxes SET network = ?, allow_internet_access = ? WHERE id = ?`, n, allowInternet, id)
}

// PlaceUnplaced records nodeID as the node of every sandbox recorded
// without one and reports how many there were. An all-in-one Cube before
// it scheduled through the node registry left the node empty; its
// in-process node owns them all.
func (s *sqlStore) PlaceUnplaced(ctx context.Context, nodeID string) (int64, error) {
	res, err := s.db.ExecContext(ctx, s.d.bind(`UPDATE sandboxes SET node_id = ? WHERE node_id = ''`), nodeID)
	if err != nil {
		return 0, fmt.Errorf("place sandboxes without a node on %s: %w", nodeID, err)
	}
	return res.RowsAffected()
}

func (s *sqlStore) execOne(ctx context.Context, what, query string, args ...any) error {
	res, err := s.db.ExecContext(ctx, s.d.bind(query), args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	}
	return nil
}

// ExpiredSandboxes returns running sandboxes whose end time is at or before now.
func (s *sqlStore) ExpiredSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error) {
	return s.query(ctx, "list expired sandboxes",
		`SELECT `+sandboxColumns+` FROM sandboxes WHERE state = ? AND end_at <= ? ORDER BY end_at`,
		string(StateRunning), toNanos(now))
}

// NextEndAt returns the earliest end time of a running sandbox strictly after
// `after`; ok is false when there is none.
func (s *sqlStore) NextEndAt(ctx context.Context, after time.Time) (t time.Time, ok bool, err error) {
	var n sql.NullInt64
	err = s.db.QueryRowContext(ctx, s.d.bind(`SELECT MIN(end_at) FROM sandboxes WHERE state = ? AND end_at > ?`),
		string(StateRunning), toNanos(after)).Scan(&n)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("next sandbox end: %w", err)
	}
	if !n.Valid {
		return time.Time{}, false, nil
	}
	return fromNanos(n.Int64), true, nil
}

// AllSandboxes returns every record, oldest first.
func (s *sqlStore) AllSandboxes(ctx context.Context) ([]Sandbox, error) {
	return s.query(ctx, "list sandboxes", `SELECT `+sandboxColumns+` FROM sandboxes ORDER BY started_at, id`)
}

func (s *sqlStore) query(ctx context.Context, what, query string, args ...any) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, s.d.bind(query), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}
