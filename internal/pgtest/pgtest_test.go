package pgtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestStartCreateStop(t *testing.T) {
	Require(t)
	ctx := context.Background()
	start := time.Now()
	s, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("initdb + start took %v", time.Since(start))
	dsn, err := s.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var fsync string
	if err := conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil || fsync != "off" {
		t.Fatalf("fsync = %q, %v", fsync, err)
	}
	conn.Close(ctx)
	dir := s.dir
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory left behind: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if c, err := pgx.Connect(cctx, dsn); err == nil {
		c.Close(ctx)
		t.Fatal("server still answers after Stop")
	}
}

func TestMissingBinaries(t *testing.T) {
	t.Setenv("CUBE_PG_BIN", t.TempDir())
	if _, err := BinDir(); err == nil {
		t.Fatal("BinDir found initdb in an empty directory")
	}
	if _, err := Start(context.Background()); err == nil {
		t.Fatal("Start succeeded without binaries")
	}
}
