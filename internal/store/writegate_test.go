package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A second writer waits at the write gate for the open transaction and
// gives up when its context ends; it runs once the transaction ends, and a
// Rollback after the Commit does not open the gate twice. (How fast the
// gate hands over, against SQLite's busy handler, is
// BenchmarkBurstOfCreates.)
func TestSQLiteWritersWaitAtTheGate(t *testing.T) {
	s, _ := openTest(t, backends[0])
	db := base(s).db
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, testSandbox("a", time.Now(), nil)); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET state = 'paused' WHERE id = 'a'`); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := s.SetEndAt(short, "a", time.Now()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("writer during a transaction: %v, want it to wait at the gate until its deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.SetEndAt(ctx, "a", time.Now()) }()
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	if err := <-done; err != nil {
		t.Fatalf("writer after the commit: %v", err)
	}
	// The gate holds one writer: two begun at once would be a gate opened
	// twice by the Rollback above.
	tx1, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		tx2, err := db.BeginTx(ctx, nil)
		if err == nil {
			err = tx2.Rollback()
		}
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("a second transaction began beside the first (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	_ = tx1.Rollback()
	if err := <-second; err != nil {
		t.Fatal(err)
	}
}
