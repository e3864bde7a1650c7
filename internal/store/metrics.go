package store

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Store query latency (docs/observability.md) is measured in one place:
// every statement the store sends goes through timedDB, which SQLite and
// PostgreSQL share, so a query added to any method is timed without a line
// of its own. A statement is named by its verb and first table
// (select_sandboxes, insert_api_keys, update_template_builds): a bounded
// set, since statements are constants of this package and arguments are
// never part of a name. A transaction is timed whole, from begin to commit
// or rollback, as tx_<its first statement>; its statements are not timed
// apart, so nothing is counted twice. Migrations run before the metrics
// are registered and are not timed.

// Outcomes of a timed statement or transaction.
const (
	outcomeOK       = "ok"
	outcomeError    = "error"
	outcomeRollback = "rollback" // a transaction rolled back (e.g. a create that found its id taken)
)

// queryBuckets span a SQLite read from the page cache (~50 µs) to a
// PostgreSQL write queued behind a lock or a slow disk (seconds).
var queryBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// RegisterMetrics registers the store's query metrics with reg; statements
// sent before are not counted. Call it once per store.
func (s *sqlStore) RegisterMetrics(reg prometheus.Registerer) error {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "cube_store_query_duration_seconds",
		Help: "Duration of control-plane store statements (SQLite or PostgreSQL), by operation (verb_table, e.g. select_sandboxes; " +
			"tx_<first statement> for a transaction timed from begin to commit or rollback) and outcome (ok, error, rollback).",
		Buckets: queryBuckets,
	}, []string{"operation", "outcome"})
	if err := reg.Register(h); err != nil {
		return err
	}
	s.db.hist.Store(h)
	return nil
}

// timedDB is the store's *sql.DB with the statement methods timed, and its
// writes (ExecContext, transactions: all are write transactions) through
// the write gate (nil: none); every other method (Close, PingContext, Conn,
// Stats ...) is the DB's own.
type timedDB struct {
	*sql.DB
	writes writeGate
	hist   atomic.Pointer[prometheus.HistogramVec] // nil until RegisterMetrics
}

func newTimedDB(db *sql.DB, writes writeGate) *timedDB { return &timedDB{DB: db, writes: writes} }

// observe records one statement or transaction; a no-op before RegisterMetrics.
func (db *timedDB) observe(op, outcome string, start time.Time) {
	if h := db.hist.Load(); h != nil {
		h.WithLabelValues(op, outcome).Observe(time.Since(start).Seconds())
	}
}

func outcomeOf(err error) string {
	if err != nil {
		return outcomeError
	}
	return outcomeOK
}

// ExecContext runs and times one statement.
func (db *timedDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	start := time.Now()
	if err := db.writes.enter(ctx); err != nil {
		db.observe(operation(query), outcomeError, start)
		return nil, err
	}
	res, err := db.DB.ExecContext(ctx, query, args...)
	db.writes.leave()
	db.observe(operation(query), outcomeOf(err), start)
	return res, err
}

// QueryRowContext runs and times one single-row query. Its sql.ErrNoRows
// appears only at Scan, so a missing row counts as ok.
func (db *timedDB) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	start := time.Now()
	row := db.DB.QueryRowContext(ctx, query, args...)
	db.observe(operation(query), outcomeOf(row.Err()), start)
	return row
}

// QueryContext runs a query; it is timed until its rows are closed, so
// reading a long listing counts too.
func (db *timedDB) QueryContext(ctx context.Context, query string, args ...any) (*timedRows, error) {
	start := time.Now()
	rows, err := db.DB.QueryContext(ctx, query, args...)
	op := operation(query)
	if err != nil {
		db.observe(op, outcomeError, start)
		return nil, err
	}
	return &timedRows{Rows: rows, done: func(err error) { db.observe(op, outcomeOf(err), start) }}, nil
}

// BeginTx begins a transaction timed until its commit or rollback, which
// hold the write gate until then.
func (db *timedDB) BeginTx(ctx context.Context, opts *sql.TxOptions) (*timedTx, error) {
	start := time.Now()
	if err := db.writes.enter(ctx); err != nil {
		db.observe("tx_begin", outcomeError, start)
		return nil, err
	}
	tx, err := db.DB.BeginTx(ctx, opts)
	if err != nil {
		db.writes.leave()
		db.observe("tx_begin", outcomeError, start)
		return nil, err
	}
	return &timedTx{Tx: tx, db: db, start: start}, nil
}

// timedRows are *sql.Rows whose Close records the query's duration once.
type timedRows struct {
	*sql.Rows
	once sync.Once
	done func(err error)
}

// Close closes the rows and records the query: an error if iterating
// failed (Err) or closing did.
func (r *timedRows) Close() error {
	err := r.Rows.Close()
	r.once.Do(func() {
		if rerr := r.Rows.Err(); rerr != nil {
			r.done(rerr)
			return
		}
		r.done(err)
	})
	return err
}

// timedTx is a transaction named by its first statement and recorded once,
// at Commit or Rollback (a deferred Rollback after Commit records nothing),
// when it also leaves the write gate. Every transaction must end in one.
type timedTx struct {
	*sql.Tx
	db    *timedDB
	start time.Time
	mu    sync.Mutex
	op    string
	ended bool
}

func (tx *timedTx) name(query string) {
	tx.mu.Lock()
	if tx.op == "" {
		tx.op = "tx_" + operation(query)
	}
	tx.mu.Unlock()
}

func (tx *timedTx) end(outcome string) {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.ended {
		return
	}
	tx.ended = true
	tx.db.writes.leave()
	op := tx.op
	if op == "" {
		op = "tx_empty"
	}
	tx.db.observe(op, outcome, tx.start)
}

// ExecContext runs a statement of the transaction.
func (tx *timedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	tx.name(query)
	return tx.Tx.ExecContext(ctx, query, args...)
}

// QueryContext runs a query of the transaction.
func (tx *timedTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	tx.name(query)
	return tx.Tx.QueryContext(ctx, query, args...)
}

// QueryRowContext runs a single-row query of the transaction.
func (tx *timedTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	tx.name(query)
	return tx.Tx.QueryRowContext(ctx, query, args...)
}

// PrepareContext prepares a statement of the transaction.
func (tx *timedTx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	tx.name(query)
	return tx.Tx.PrepareContext(ctx, query)
}

// Commit commits and records the transaction.
func (tx *timedTx) Commit() error {
	err := tx.Tx.Commit()
	tx.end(outcomeOf(err))
	return err
}

// Rollback rolls back and records the transaction (once: after a Commit
// it only returns sql.ErrTxDone).
func (tx *timedTx) Rollback() error {
	err := tx.Tx.Rollback()
	tx.end(outcomeRollback)
	return err
}

// operation names a statement "verb_table" from its text: the verb is
// select, insert, update or delete ("other" for anything else), the table
// the first one after FROM (select, delete), INTO (insert) or UPDATE, at
// the statement's top level; just the verb when there is none.
func operation(query string) string {
	if op, ok := opCache.Load(query); ok {
		return op.(string)
	}
	op := parseOperation(query)
	// Statements are this package's constants, except a listing's WHERE,
	// whose shape follows its filters: the cache is bounded all the same.
	if opCacheLen.Load() < maxOpCache {
		if _, loaded := opCache.LoadOrStore(query, op); !loaded {
			opCacheLen.Add(1)
		}
	}
	return op
}

// opCache maps statement texts to their operation names.
var (
	opCache    sync.Map
	opCacheLen atomic.Int32
)

const maxOpCache = 1024

func parseOperation(query string) string {
	words := sqlWords{s: query}
	verb := words.next()
	var after string
	switch verb {
	case "select", "delete":
		after = "from"
	case "insert":
		after = "into"
	case "update":
		return join(verb, words.next())
	default:
		return "other"
	}
	for w := words.next(); w != ""; w = words.next() {
		if w == after && words.depth == 0 {
			if table := words.next(); words.depth == 0 { // not a subquery
				return join(verb, table)
			}
			return verb
		}
	}
	return verb
}

func join(verb, table string) string {
	if !identifier(table) {
		return verb
	}
	return verb + "_" + table
}

// identifier reports whether s is a plain lower-case table name short
// enough to be a label value.
func identifier(s string) bool {
	if s == "" || len(s) > 63 || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// sqlWords yields the words of a statement lower-cased, skipping string
// literals and comments, and tracks the parenthesis depth.
type sqlWords struct {
	s     string
	i     int
	depth int
}

func (w *sqlWords) next() string {
	for w.i < len(w.s) {
		c := w.s[w.i]
		switch {
		case c == '(':
			w.depth++
			w.i++
		case c == ')':
			w.depth--
			w.i++
		case c == '\'' || c == '"':
			end := w.i + 1
			for end < len(w.s) && w.s[end] != c {
				end++
			}
			w.i = end + 1
		case c == '-' && w.i+1 < len(w.s) && w.s[w.i+1] == '-':
			for w.i < len(w.s) && w.s[w.i] != '\n' {
				w.i++
			}
		case wordByte(c):
			start := w.i
			for w.i < len(w.s) && wordByte(w.s[w.i]) {
				w.i++
			}
			return lower(w.s[start:w.i])
		default:
			w.i++
		}
	}
	return ""
}

func wordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// lower is strings.ToLower for ASCII words, without allocating when the
// word is already lower case (table names are).
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] >= 'A' && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
