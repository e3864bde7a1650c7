package store

import (
	"strconv"
	"strings"
)

// dialect holds every difference between the SQL Cube sends to SQLite and
// to PostgreSQL. Everything else (schema, queries, upserts with
// ON CONFLICT, BIGINT nanosecond timestamps, BOOLEAN, TEXT) is written once
// in the subset both engines accept.
type dialect struct {
	// name is "sqlite" or "postgres", for error messages.
	name string
	// numbered: placeholders are $1, $2, ... instead of ?.
	numbered bool
	// migrationLock runs first in every migration transaction so that
	// replicas starting at once migrate one after the other. SQLite needs
	// none: its transactions begin IMMEDIATE and hold the write lock.
	migrationLock string
}

var (
	sqliteDialect = dialect{name: "sqlite"}
	// The advisory lock key is an arbitrary constant private to Cube's
	// migrations ("cube-mig" in ASCII); internal/leader uses other keys.
	postgresDialect = dialect{
		name:          "postgres",
		numbered:      true,
		migrationLock: `SELECT pg_advisory_xact_lock(7166478662130706791)`,
	}
)

// bind rewrites the ? placeholders of query for d. Question marks inside
// single-quoted literals, double-quoted identifiers and comments are left
// alone.
func (d dialect) bind(query string) string {
	if !d.numbered || !strings.Contains(query, "?") {
		return query
	}
	var (
		b     strings.Builder
		n     int
		quote byte // ' or " while inside a literal/identifier
	)
	b.Grow(len(query) + 8)
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			end := strings.IndexByte(query[i:], '\n')
			if end < 0 {
				end = len(query) - i
			}
			b.WriteString(query[i : i+end])
			i += end - 1
			continue
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
