package store

import "testing"

func FuzzDecodeCursor(f *testing.F) {
	f.Add(encodeCursor(cursor{startedAt: 1, id: "abc"}))
	f.Add("")
	f.Add("djE6MTox")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := decodeCursor(tok)
		if err != nil {
			return
		}
		if c2, err := decodeCursor(encodeCursor(c)); err != nil || c2 != c {
			t.Fatalf("round trip: %+v -> %+v, %v", c, c2, err)
		}
	})
}
