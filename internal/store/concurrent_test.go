package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cube-dev/cube/internal/errdefs"
)

// openReplicas opens n handles on one fresh database at once, as n server
// replicas starting together would: their migrations race.
func openReplicas(t *testing.T, b backend, n int) []Store {
	t.Helper()
	dsn := b.newDSN(t)
	out := make([]Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() { out[i], errs[i] = Open(context.Background(), dsn) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		t.Cleanup(func() { out[i].Close() })
	}
	return out
}

func TestReplicasMigrateAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		rs := openReplicas(t, b, 4)
		for i, s := range rs {
			if v, err := s.SchemaVersion(context.Background()); err != nil || v != LatestSchemaVersion {
				t.Fatalf("replica %d: version %d, %v", i, v, err)
			}
		}
		if n := rawCount(t, rs[0], `SELECT COUNT(*) FROM schema_version`); n != 1 {
			t.Fatalf("schema_version has %d rows, want 1", n)
		}
	})
}

func TestReplicasCreateSameIDOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		rs := openReplicas(t, b, 2)
		ctx := context.Background()
		const writers = 16
		errs := make([]error, writers)
		var wg sync.WaitGroup
		for i := range writers {
			wg.Go(func() {
				sb := testSandbox("dup", time.Now(), map[string]string{"writer": fmt.Sprint(i), "x": "y"})
				errs[i] = rs[i%2].CreateSandbox(ctx, sb)
			})
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, errdefs.ErrAlreadyExists):
				t.Errorf("writer %d: %v, want nil or ErrAlreadyExists", i, err)
			}
		}
		if won != 1 {
			t.Fatalf("%d writers created the same id, want 1", won)
		}
		got, err := rs[1].GetSandbox(ctx, "dup")
		if err != nil {
			t.Fatal(err)
		}
		// The winner's metadata, and only it, is indexed.
		if n := rawCount(t, rs[0], `SELECT COUNT(*) FROM sandbox_metadata WHERE sandbox_id = ?`, "dup"); n != 2 {
			t.Fatalf("metadata rows = %d, want 2", n)
		}
		p, err := rs[0].ListSandboxes(ctx, ListFilter{Metadata: map[string]string{"writer": got.Metadata["writer"]}})
		if err != nil || len(p.Sandboxes) != 1 {
			t.Fatalf("metadata index of the winner: %d, %v", len(p.Sandboxes), err)
		}
	})
}

func TestReplicasWriteWithoutLosingRecords(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		rs := openReplicas(t, b, 2)
		ctx := context.Background()
		const perReplica = 40
		var wg sync.WaitGroup
		errc := make(chan error, 4*perReplica)
		now := time.Now()
		for r, s := range rs {
			wg.Go(func() {
				for i := range perReplica {
					id := fmt.Sprintf("r%d-%03d", r, i)
					if err := s.CreateSandbox(ctx, testSandbox(id, now, nil)); err != nil {
						errc <- err
						continue
					}
					// The other replica updates the record right away.
					if err := rs[1-r].SetEndAt(ctx, id, now.Add(time.Hour)); err != nil {
						errc <- err
					}
				}
			})
			// Both replicas verify the same key at the same time.
			wg.Go(func() {
				for range 10 {
					if _, err := s.AddKeyHash(ctx, "shared", "one-secret"); err != nil {
						errc <- err
					}
				}
			})
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		for i, s := range rs {
			all, err := s.AllSandboxes(ctx)
			if err != nil || len(all) != 2*perReplica {
				t.Fatalf("replica %d sees %d records, %v; want %d", i, len(all), err, 2*perReplica)
			}
			for _, sb := range all {
				if !sb.EndAt.Equal(now.Add(time.Hour)) {
					t.Fatalf("update lost on %s: endAt %v", sb.ID, sb.EndAt)
				}
			}
		}
		keys, err := rs[0].ListKeys(ctx)
		if err != nil || len(keys) != 1 {
			t.Fatalf("keys after concurrent adds: %d, %v; want 1", len(keys), err)
		}
	})
}

func TestReplicasUpdateVersusDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		rs := openReplicas(t, b, 2)
		ctx := context.Background()
		for i := range 20 {
			if err := rs[0].CreateSandbox(ctx, testSandbox(fmt.Sprintf("u%02d", i), time.Now(), map[string]string{"k": "v"})); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errc := make(chan error, 40)
		for i := range 20 {
			id := fmt.Sprintf("u%02d", i)
			wg.Go(func() {
				if err := rs[0].DeleteSandbox(ctx, id); err != nil {
					errc <- err
				}
			})
			wg.Go(func() {
				err := rs[1].SetState(ctx, id, StatePaused, time.Now())
				if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					errc <- err
				}
			})
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
		if all, _ := rs[1].AllSandboxes(ctx); len(all) != 0 {
			t.Fatalf("%d records survived delete", len(all))
		}
		if n := rawCount(t, rs[1], `SELECT COUNT(*) FROM sandbox_metadata`); n != 0 {
			t.Fatalf("%d metadata rows survived delete", n)
		}
	})
}

func TestNodeDataOnBothBackends(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		rs := openReplicas(t, b, 2)
		ctx := context.Background()
		var wg sync.WaitGroup
		for r, s := range rs {
			wg.Go(func() {
				for i := range 10 {
					if err := s.PutNodeData(ctx, "n1", []byte(fmt.Sprintf(`{"by":%d,"i":%d}`, r, i))); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		docs, err := rs[1].ListNodeData(ctx)
		if err != nil || len(docs) != 1 || len(docs["n1"].Data) == 0 {
			t.Fatalf("nodes after concurrent upserts: %v, %v", docs, err)
		}
		if err := rs[0].DeleteNodeData(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if err := rs[1].DeleteNodeData(ctx, "n1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
	})
}
