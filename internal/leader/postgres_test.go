package leader

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cube-dev/cube/internal/errdefs"
	"github.com/cube-dev/cube/internal/pgtest"
)

// handoverBound is the failover time the issue requires.
const handoverBound = 15 * time.Second

// replica is one elector running leader.Run; it records when it leads.
type replica struct {
	name    string
	cancel  context.CancelFunc
	done    chan struct{} // closed when Run returned; err is its result
	err     error
	leading atomic.Bool
	causes  chan error // cause of each leadership end
	started chan time.Time
}

// cluster tracks how many replicas lead at once.
type cluster struct {
	mu      sync.Mutex
	leaders int
	maxSeen int
}

func (c *cluster) enter() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaders++
	c.maxSeen = max(c.maxSeen, c.leaders)
}

func (c *cluster) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaders--
}

func (c *cluster) max() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxSeen
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startReplica(t *testing.T, c *cluster, dsn, name string) *replica {
	t.Helper()
	e, err := NewPostgres(dsn, PostgresConfig{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{name: name, cancel: cancel, done: make(chan struct{}),
		causes: make(chan error, 16), started: make(chan time.Time, 16)}
	go func() {
		defer close(r.done)
		r.err = Run(ctx, e, func(ctx context.Context) error {
			c.enter()
			r.leading.Store(true)
			r.started <- time.Now()
			<-ctx.Done()
			r.leading.Store(false)
			c.leave()
			r.causes <- context.Cause(ctx)
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Errorf("%s: Run did not return", name)
		}
	})
	return r
}

// waitLeader returns whichever of rs starts leading first, and when.
func waitLeader(t *testing.T, rs ...*replica) (*replica, time.Time) {
	t.Helper()
	timeout := time.After(handoverBound + 5*time.Second)
	for {
		for _, r := range rs {
			select {
			case at := <-r.started:
				return r, at
			default:
			}
		}
		select {
		case <-timeout:
			t.Fatal("no replica became leader")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lockHolder returns the backend pid holding the leader lock.
func lockHolder(t *testing.T, admin *pgx.Conn) int {
	t.Helper()
	key := LockKey("cube-server")
	var pid int
	err := admin.QueryRow(context.Background(), `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1 AND objid = $2`, uint32(uint64(key)>>32), uint32(uint64(key))).Scan(&pid)
	if err != nil {
		t.Fatalf("find lock holder: %v", err)
	}
	return pid
}

func setup(t *testing.T) (dsn string, admin *pgx.Conn) {
	t.Helper()
	srv := pgtest.New(t)
	dsn = srv.NewDatabase(t)
	admin, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	return dsn, admin
}

func TestPostgresFailoverWhenLeaderBackendTerminated(t *testing.T) {
	dsn, admin := setup(t)
	var c cluster
	a := startReplica(t, &c, dsn, "a")
	b := startReplica(t, &c, dsn, "b")
	current, _ := waitLeader(t, a, b)
	for round := range 3 {
		pid := lockHolder(t, admin)
		killed := time.Now()
		if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		select {
		case cause := <-current.causes:
			if !errors.Is(cause, ErrLost) {
				t.Fatalf("old leader's context ended with %v, want ErrLost", cause)
			}
			t.Logf("round %d: %s noticed the loss after %v", round, current.name, time.Since(killed))
		case <-time.After(handoverBound):
			t.Fatal("old leader did not notice its session was terminated")
		}
		// Either replica may win the new campaign (the old leader campaigns
		// again on a new connection).
		next, at := waitLeader(t, a, b)
		took := at.Sub(killed)
		t.Logf("round %d: %s's backend terminated, %s leads after %v", round, current.name, next.name, took)
		if took > handoverBound {
			t.Fatalf("handover took %v, want <= %v", took, handoverBound)
		}
		current = next
	}
	if m := c.max(); m != 1 {
		t.Fatalf("%d replicas led at the same time", m)
	}
}

func TestPostgresFailoverWhenLeaderStops(t *testing.T) {
	dsn, admin := setup(t)
	var c cluster
	a := startReplica(t, &c, dsn, "a")
	b := startReplica(t, &c, dsn, "b")
	first, _ := waitLeader(t, a, b)
	other := map[*replica]*replica{a: b, b: a}[first]
	stopped := time.Now()
	first.cancel()
	<-first.done
	if first.err != nil {
		t.Fatalf("Run of the stopped leader = %v", first.err)
	}
	_, at := waitLeader(t, other)
	took := at.Sub(stopped)
	t.Logf("%s stopped, %s leads after %v", first.name, other.name, took)
	if took > handoverBound {
		t.Fatalf("handover took %v, want <= %v", took, handoverBound)
	}
	if m := c.max(); m != 1 {
		t.Fatalf("%d replicas led at the same time", m)
	}
	if pid := lockHolder(t, admin); pid == 0 {
		t.Fatal("no lock holder")
	}
}

func TestPostgresNamesAreIndependent(t *testing.T) {
	dsn, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var releases []func()
	for _, name := range []string{"reaper", "health"} {
		e, err := NewPostgres(dsn, PostgresConfig{Name: name, TakeoverDelay: time.Millisecond, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		leading, release, err := e.Acquire(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if leading.Err() != nil {
			t.Fatalf("%s: leadership context already done", name)
		}
		releases = append(releases, release)
	}
	// A second contender for "reaper" does not get it while it is held.
	e, _ := NewPostgres(dsn, PostgresConfig{Name: "reaper", Logger: quietLogger()})
	short, cancelShort := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancelShort()
	if _, _, err := e.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second contender: %v, want a deadline error", err)
	}
	for _, r := range releases {
		r()
	}
	// Released: now it can.
	leading, release, err := e.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if !errors.Is(context.Cause(leading), context.Canceled) {
		t.Fatalf("cause after release: %v", context.Cause(leading))
	}
}

func TestPostgresUnreachableNeverLeads(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	e, err := NewPostgres("postgres://cube@"+addr+"/cube?sslmode=disable", PostgresConfig{
		RetryInterval: 100 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ran := false
	if err := Run(ctx, e, func(context.Context) error { ran = true; return nil }); err != nil {
		t.Fatalf("Run = %v, want nil at ctx end", err)
	}
	if ran {
		t.Fatal("led without a database")
	}
	if _, err := NewPostgres("host=x port=notaport", PostgresConfig{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad dsn: %v", err)
	}
}
