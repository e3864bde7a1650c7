package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cube-dev/cube/internal/pgtest"
)

// postgres is the control plane's database: Debian's PostgreSQL on the host,
// listening on the node IP, reached by cube-server through the chart's
// database.mode=external (a Secret with the URL). It returns that URL.
func startPostgres(ctx context.Context, c *Config) (string, error) {
	bin, err := pgtest.BinDir()
	if err != nil {
		return "", err
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return "", fmt.Errorf("postgres OS user (Debian package postgresql, make deps): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return "", err
	}
	dir := c.p("postgres")
	data, sock := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	for _, d := range []string{dir, sock} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", err
		}
		if err := os.Chown(d, uid, gid); err != nil {
			return "", err
		}
	}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		initdb := component{name: "initdb", path: filepath.Join(bin, "initdb"), cred: cred,
			args: []string{"-D", data, "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C"}}
		p, err := start(ctx, c, initdb)
		if err != nil {
			return "", err
		}
		<-p.exited
		if p.err != nil {
			return "", fmt.Errorf("initdb: %w\n%s", p.err, tail(c.logFile("initdb"), 20))
		}
		// Pods reach it from the pod network, hostNetwork Pods from the node IP.
		hba := fmt.Sprintf("local all all trust\nhost all all %s/32 scram-sha-256\nhost all all %s scram-sha-256\n", c.NodeIP, c.PodCIDR)
		if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
			return "", err
		}
		os.Chown(filepath.Join(data, "pg_hba.conf"), uid, gid)
	}
	addr := fmt.Sprintf("%s:%d", c.NodeIP, c.PGPort)
	if _, err := start(ctx, c, component{
		name: "postgres", path: filepath.Join(bin, "postgres"), cred: cred,
		args: []string{"-D", data, "-p", strconv.Itoa(c.PGPort), "-c", "listen_addresses=" + c.NodeIP.String(),
			"-c", "unix_socket_directories=" + sock, "-c", "max_connections=200"},
		ready: dialReady(addr),
	}); err != nil {
		return "", err
	}
	return createDatabase(ctx, c, sock)
}

// createDatabase makes the role and database cube (once) with a fresh
// password and returns the URL Pods use.
func createDatabase(ctx context.Context, c *Config, sock string) (string, error) {
	pw := make([]byte, 16)
	rand.Read(pw)
	pass := hex.EncodeToString(pw)
	var conn *pgx.Conn
	var err error
	for range 40 { // the socket appears a moment after the TCP listener
		conn, err = pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", sock, c.PGPort))
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	if err != nil {
		return "", fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cube')").Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE ROLE cube LOGIN"); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE cube OWNER cube"); err != nil {
			return "", err
		}
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER ROLE cube PASSWORD '%s'", pass)); err != nil {
		return "", err
	}
	return fmt.Sprintf("postgres://cube:%s@%s:%d/cube?sslmode=disable", pass, c.NodeIP, c.PGPort), nil
}
