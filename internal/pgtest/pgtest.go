// Package pgtest starts throwaway PostgreSQL servers for tests: initdb into a
// fresh temporary directory, a postmaster on a free loopback port and a
// private unix socket directory, fsync off. The postmaster is a child of the
// test process and gets SIGQUIT if the test process dies, so no server
// outlives its test binary.
//
// When the PostgreSQL binaries are missing, Require fails the test if the
// environment variable CI is set and skips it otherwise; hack/deps.sh
// installs them (Debian package postgresql).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPostgres means the PostgreSQL server binaries were not found.
var ErrNoPostgres = errors.New("postgresql server binaries (initdb, postgres) not found; install the Debian package postgresql (hack/deps.sh) or set CUBE_PG_BIN")

// startTimeout bounds initdb plus server start-up.
const startTimeout = 60 * time.Second

// Server is one running throwaway PostgreSQL cluster.
type Server struct {
	dir     string
	port    int
	cmd     *exec.Cmd
	exited  chan struct{}
	dbs     atomic.Int64
	stop    sync.Once
	stopErr error
}

// BinDir returns the directory holding initdb and postgres: $CUBE_PG_BIN,
// else the newest /usr/lib/postgresql/*/bin (Debian), else $PATH.
func BinDir() (string, error) {
	if d := os.Getenv("CUBE_PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err != nil {
			return "", fmt.Errorf("CUBE_PG_BIN=%s: %w", d, ErrNoPostgres)
		}
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return pgMajor(matches[i]) > pgMajor(matches[j]) })
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNoPostgres
}

func pgMajor(initdbPath string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdbPath))))
	return n
}

// Start creates and starts a cluster. Stop it with Stop.
func Start(ctx context.Context) (_ *Server, err error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cube-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgtest: chown %s: %w", dir, err)
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"),
		"-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	initdb.Dir, initdb.Env = dir, []string{"LC_ALL=C", "PATH=" + bin + ":/usr/bin:/bin"}
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w: %s", err, lastLines(string(out), 10))
	}
	// A port taken between probe and bind makes the start fail; try a few.
	for attempt := 0; ; attempt++ {
		s, err := startServer(ctx, bin, dir, cred)
		if err == nil {
			return s, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// serverCredential returns the credential to run PostgreSQL under: the
// postgres OS user when running as root (PostgreSQL refuses root), nil
// (the current user) otherwise.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs the postgres OS user (created by the postgresql package): %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort returns a loopback port that is free and that really reaches a
// listener on this host: NAT rules (other tests' port maps) can redirect
// local port ranges, so the port is probed with a connection first.
func freePort() (int, error) {
	var lastErr error
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		lastErr = probe(l)
		l.Close()
		if lastErr == nil {
			return port, nil
		}
	}
	return 0, fmt.Errorf("no loopback port reaches its own listener: %w", lastErr)
}

// probe dials l and checks that l itself accepts the connection.
func probe(l net.Listener) error {
	c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	l.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
	a, err := l.Accept()
	if err != nil {
		return err
	}
	ok := a.RemoteAddr().String() == c.LocalAddr().String()
	a.Close()
	if !ok {
		return fmt.Errorf("port %s is redirected", l.Addr())
	}
	return nil
}

func startServer(ctx context.Context, bin, dir string, cred *syscall.Credential) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: free port: %w", err)
	}
	logPath := filepath.Join(dir, "server.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	s := &Server{dir: dir, port: port, exited: make(chan struct{})}
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", filepath.Join(dir, "data"),
		"-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200")
	s.cmd.Dir, s.cmd.Env = dir, []string{"LC_ALL=C"}
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	// Pdeathsig is tied to the thread that forks, so fork from a locked
	// thread that lives until the postmaster exits.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			started <- err
			close(s.exited)
			return
		}
		started <- nil
		s.cmd.Wait()
		close(s.exited)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("pgtest: start postgres: %w", err)
	}
	if err := s.waitReady(ctx); err != nil {
		s.kill()
		log, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("pgtest: %w: %s", err, lastLines(string(log), 30))
	}
	return s, nil
}

func (s *Server) waitReady(ctx context.Context) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, s.DSN("postgres"))
		cancel()
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("postgres exited during start-up")
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DSN returns the URL of database db on this server (superuser, trust auth).
func (s *Server) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// CreateDatabase creates a new empty database and returns its DSN.
func (s *Server) CreateDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("cube_test_%d", s.dbs.Add(1))
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return s.DSN(name), nil
}

// Stop shuts the server down immediately and removes its directory. It is
// safe to call more than once.
func (s *Server) Stop() error {
	s.stop.Do(func() {
		s.kill()
		s.stopErr = os.RemoveAll(s.dir)
	})
	return s.stopErr
}

// kill sends SIGQUIT (immediate shutdown) and waits up to 10 s, then SIGKILLs
// the whole process group.
func (s *Server) kill() {
	if s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
		return
	case <-time.After(10 * time.Second):
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
