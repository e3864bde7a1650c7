package leader

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cube-dev/cube/internal/errdefs"
)

// PostgresConfig tunes a Postgres elector. Zero values take the defaults.
type PostgresConfig struct {
	// Name identifies what is being led; replicas using the same database
	// and Name compete for one lock. Default "cube-server".
	Name string
	// RetryInterval is how often a follower tries to take the lock, and
	// how long it waits after a connection error. Default 1 s.
	RetryInterval time.Duration
	// CheckInterval is how often the leader verifies, on its connection,
	// that it still holds the lock. Default 1 s.
	CheckInterval time.Duration
	// CheckTimeout bounds one check; a check that fails or times out ends
	// leadership. Default 1 s.
	CheckTimeout time.Duration
	// TakeoverDelay is how long a replica that just took the lock waits
	// before it leads, so that a previous leader whose session was cut has
	// noticed it by its next check and stopped. Default CheckInterval +
	// CheckTimeout + 500 ms.
	TakeoverDelay time.Duration
	// ConnectTimeout bounds one connection attempt. Default 5 s.
	ConnectTimeout time.Duration
	// Logger receives campaign failures and leadership changes.
	// Default slog.Default().
	Logger *slog.Logger
}

// Server-side TCP keepalive for the lock session: when a leader's host
// vanishes without closing its socket, PostgreSQL drops the session (and
// with it the lock) after about idle + interval*count = 8 s instead of the
// kernel default of hours. Ignored on unix-socket connections.
var keepaliveParams = map[string]string{
	"tcp_keepalives_idle":     "5",
	"tcp_keepalives_interval": "1",
	"tcp_keepalives_count":    "3",
}

// Postgres elects with a PostgreSQL session-level advisory lock
// (pg_try_advisory_lock) held on a connection dedicated to it. The lock
// lives exactly as long as that session, so a leader that crashes, is
// killed or whose backend is terminated loses it at once; the leader
// re-checks the lock every CheckInterval and steps down when a check fails.
type Postgres struct {
	conn *pgx.ConnConfig
	key  int64
	cfg  PostgresConfig
	log  *slog.Logger
}

var _ Elector = (*Postgres)(nil)

// NewPostgres returns an elector for the database at dsn (a postgres:// URL
// or key=value string); it does not connect yet.
func NewPostgres(dsn string, cfg PostgresConfig) (*Postgres, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("leader: %w: parse database address: %w", errdefs.ErrInvalidArgument, err)
	}
	if cfg.Name == "" {
		cfg.Name = "cube-server"
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = time.Second
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = time.Second
	}
	if cfg.TakeoverDelay <= 0 {
		cfg.TakeoverDelay = cfg.CheckInterval + cfg.CheckTimeout + 500*time.Millisecond
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cc.ConnectTimeout = cfg.ConnectTimeout
	for k, v := range keepaliveParams {
		if _, ok := cc.RuntimeParams[k]; !ok {
			cc.RuntimeParams[k] = v
		}
	}
	cc.RuntimeParams["application_name"] = "cube-leader " + cfg.Name
	return &Postgres{conn: cc, key: LockKey(cfg.Name), cfg: cfg,
		log: cfg.Logger.With("component", "leader", "name", cfg.Name)}, nil
}

// LockKey is the advisory lock key used for name (FNV-1a of
// "cube/leader/"+name), for operators looking at pg_locks.
func LockKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("cube/leader/" + name))
	return int64(h.Sum64())
}

// Acquire campaigns until this replica holds the lock, then waits
// TakeoverDelay (still checking the lock) and returns. Connection errors are
// retried every RetryInterval until ctx is done.
func (e *Postgres) Acquire(ctx context.Context) (context.Context, func(), error) {
	var (
		conn    *pgx.Conn
		lastErr string
	)
	for {
		var err error
		if conn == nil {
			conn, err = pgx.ConnectConfig(ctx, e.conn)
		}
		if err == nil {
			var got bool
			if got, err = e.tryLock(ctx, conn); err == nil && got {
				leading, release, ok := e.lead(ctx, conn)
				if ok {
					e.log.Info("leadership acquired")
					return leading, release, nil
				}
				conn = nil // lead closed it
			} else if err != nil {
				closeConn(conn)
				conn = nil
			}
		}
		if err != nil && ctx.Err() == nil && err.Error() != lastErr {
			e.log.Warn("leader campaign failing; retrying", "err", err, "retry", e.cfg.RetryInterval)
			lastErr = err.Error()
		}
		select {
		case <-ctx.Done():
			if conn != nil {
				closeConn(conn)
			}
			return nil, nil, ctx.Err()
		case <-time.After(e.cfg.RetryInterval):
		}
	}
}

func (e *Postgres) tryLock(ctx context.Context, conn *pgx.Conn) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	var got bool
	if err := conn.QueryRow(cctx, `SELECT pg_try_advisory_lock($1)`, e.key).Scan(&got); err != nil {
		return false, fmt.Errorf("try advisory lock: %w", err)
	}
	return got, nil
}

// lead starts watching the lock held on conn and waits TakeoverDelay. ok is
// false (and conn closed) when leadership ended during the wait.
func (e *Postgres) lead(ctx context.Context, conn *pgx.Conn) (leading context.Context, release func(), ok bool) {
	leading, cancel := context.WithCancelCause(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		e.watch(leading, cancel, conn)
	}()
	release = sync.OnceFunc(func() {
		cancel(context.Canceled)
		<-watched
		closeConn(conn) // ends the session: PostgreSQL drops the lock
	})
	delay := time.NewTimer(e.cfg.TakeoverDelay)
	defer delay.Stop()
	select {
	case <-delay.C:
		return leading, release, true
	case <-leading.Done():
		release()
		return nil, nil, false
	}
}

// watch checks every CheckInterval that conn's session still holds the
// lock and cancels leading with ErrLost when it does not or cannot tell.
func (e *Postgres) watch(leading context.Context, cancel context.CancelCauseFunc, conn *pgx.Conn) {
	tick := time.NewTicker(e.cfg.CheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-leading.Done():
			return
		case <-tick.C:
		}
		held, err := e.held(leading, conn)
		if leading.Err() != nil {
			return
		}
		if err == nil && !held {
			err = fmt.Errorf("advisory lock %d no longer held by this session", e.key)
		}
		if err != nil {
			e.log.Warn("leadership lost", "err", err)
			cancel(fmt.Errorf("%w: %w", ErrLost, err))
			return
		}
	}
}

// held reports whether conn's session holds the lock, per pg_locks (a
// bigint advisory key appears as classid = high 32 bits, objid = low 32
// bits, objsubid = 1).
func (e *Postgres) held(ctx context.Context, conn *pgx.Conn) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, e.cfg.CheckTimeout)
	defer cancel()
	var held bool
	err := conn.QueryRow(cctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
		AND pid = pg_backend_pid() AND granted AND objsubid = 1 AND classid = $1 AND objid = $2)`,
		uint32(uint64(e.key)>>32), uint32(uint64(e.key))).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("check advisory lock: %w", err)
	}
	return held, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn.Close(ctx)
}
