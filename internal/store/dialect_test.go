package store

import "testing"

func TestBind(t *testing.T) {
	cases := []struct{ in, sqlite, pg string }{
		{`SELECT 1`, `SELECT 1`, `SELECT 1`},
		{`a = ? AND b IN (?, ?)`, `a = ? AND b IN (?, ?)`, `a = $1 AND b IN ($2, $3)`},
		{`x = '?' AND y = ?`, `x = '?' AND y = ?`, `x = '?' AND y = $1`},
		{`"col?" = ? -- why?` + "\n" + `AND z = ?`, `"col?" = ? -- why?` + "\n" + `AND z = ?`, `"col?" = $1 -- why?` + "\n" + `AND z = $2`},
		{`x = 'it''s ?' OR y = ?`, `x = 'it''s ?' OR y = ?`, `x = 'it''s ?' OR y = $1`},
		{`trailing -- ?`, `trailing -- ?`, `trailing -- ?`},
	}
	for _, c := range cases {
		if got := sqliteDialect.bind(c.in); got != c.sqlite {
			t.Errorf("sqlite bind(%q) = %q", c.in, got)
		}
		if got := postgresDialect.bind(c.in); got != c.pg {
			t.Errorf("postgres bind(%q) = %q, want %q", c.in, got, c.pg)
		}
	}
}
