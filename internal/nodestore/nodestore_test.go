package nodestore

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cube-dev/cube/internal/errdefs"
)

func TestPutGetListDelete(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := Sandbox{ID: "abc", Template: "base", State: StateCreating, IP: netip.MustParseAddr("172.16.0.2"),
		Ports: map[uint16]uint16{49983: 20000}, CreatedAt: time.Now().UTC().Truncate(time.Second)}
	if err := s.Put(sb); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(Sandbox{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Put without id: %v", err)
	}
	// Survives reopen (durability across a cubelet restart).
	s.Close()
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get("abc")
	if err != nil {
		t.Fatal(err)
	}
	if got.IP != sb.IP || got.Ports[49983] != 20000 || got.State != StateCreating {
		t.Fatalf("got %+v", got)
	}
	if _, err := s.Get("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get missing: %v", err)
	}
	list, bad := s.List()
	if len(list) != 1 || len(bad) != 0 {
		t.Fatalf("List = %v %v", list, bad)
	}
	if err := s.Delete("abc"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("abc"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

func TestGenerationIsMonotonic(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "node.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, _ := s.NextGeneration()
	b, _ := s.NextGeneration()
	if b <= a {
		t.Fatalf("generation not increasing: %d then %d", a, b)
	}
}

func TestCorruptRecordIsQuarantinedNotFatal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s.Put(Sandbox{ID: "good"})
	s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte("broken"), []byte("{not json"))
	})
	s.Close()
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	list, bad := s.List()
	if _, gerr := s.Get("broken"); !errors.Is(gerr, errdefs.ErrInvalidArgument) {
		t.Errorf("Get of a corrupt record: %v, want ErrInvalidArgument", gerr)
	}
	// Rewriting a corrupt record heals it.
	if err := s.Put(Sandbox{ID: "broken"}); err != nil {
		t.Fatal(err)
	}
	if _, b2 := s.List(); len(b2) != 0 {
		t.Errorf("bad after rewrite: %v", b2)
	}
	s.Close()
	if len(list) != 1 || len(bad) != 1 || bad[0] != "broken" {
		t.Fatalf("List = %v %v", list, bad)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucketIfNotExists(bucketMeta)
		v, _ := json.Marshal(SchemaVersion + 1)
		return b.Put(keySchema, v)
	})
	db.Close()
	if _, err := Open(path); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Open newer schema: %v", err)
	}
}

// TestSchema1StoreOpens: a store written by a schema-1 cubelet (records
// without runtimeID) opens, reads its records with Runtime() == ID, and is
// marked with the current schema afterwards.
func TestSchema1StoreOpens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	const old = `{"id":"sbx-old","generation":3,"template":"base","state":"running","ip":"172.16.0.7",` +
		`"ports":{"49983":30001},"cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"envdVersion":"0.5.7",` +
		`"allowInternet":true,"createdAt":"2026-11-01T00:00:00Z"}`
	err = db.Update(func(tx *bolt.Tx) error {
		meta, _ := tx.CreateBucketIfNotExists(bucketMeta)
		sbs, _ := tx.CreateBucketIfNotExists(bucketSandboxes)
		if err := meta.Put(keySchema, []byte("1")); err != nil {
			return err
		}
		return sbs.Put([]byte("sbx-old"), []byte(old))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Get("sbx-old")
	if err != nil {
		t.Fatal(err)
	}
	if r.RuntimeID != "" || r.Runtime() != "sbx-old" || r.Ports[49983] != 30001 || r.State != StateRunning {
		t.Fatalf("schema-1 record read as %+v", r)
	}
	r.RuntimeID = "pool-0123456789ab"
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Get("sbx-old"); r.Runtime() != "pool-0123456789ab" {
		t.Fatalf("runtime after put: %+v", r)
	}
	var schema int
	s.db.View(func(tx *bolt.Tx) error { return json.Unmarshal(tx.Bucket(bucketMeta).Get(keySchema), &schema) })
	if schema != SchemaVersion {
		t.Fatalf("schema after open %d, want %d", schema, SchemaVersion)
	}
}

// TestConcurrentWritesGroupCommit: concurrent writes (committed together
// when they overlap) all land, generations stay unique, and a failing write
// fails alone.
func TestConcurrentWritesGroupCommit(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "node.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 64
	var wg sync.WaitGroup
	gens := make([]uint64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			g, err := s.NextGeneration()
			if err == nil {
				err = s.Put(Sandbox{ID: fmt.Sprintf("sbx-%02d", i), State: StateRunning})
			}
			gens[i], errs[i] = g, err
		})
	}
	for range 4 {
		wg.Go(func() {
			// bbolt refuses keys over 32 KiB inside the transaction.
			if err := s.Put(Sandbox{ID: strings.Repeat("x", 40000)}); err == nil {
				t.Errorf("put with a huge key succeeded")
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i := range n {
		if errs[i] != nil || seen[gens[i]] {
			t.Fatalf("write %d: gen %d, %v", i, gens[i], errs[i])
		}
		seen[gens[i]] = true
	}
	recs, bad := s.List()
	if len(recs) != n || len(bad) != 0 {
		t.Fatalf("list: %d records, bad %v", len(recs), bad)
	}
}

// The decoded records the store keeps must equal the file after any mix
// of concurrent writes (group commits included), and callers changing a
// record they read must not change the store's copy.
func TestRecordCacheFollowsCommits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				id := fmt.Sprintf("sb-%d-%d", w, i%7)
				switch i % 3 {
				case 0:
					s.Put(Sandbox{ID: id, Ports: map[uint16]uint16{49983: uint16(30000 + i)}})
				case 1:
					s.PutReplacing(Sandbox{ID: id + "-x", Ports: map[uint16]uint16{1: 2}}, id)
				case 2:
					s.Delete(fmt.Sprintf("sb-%d-%d-x", w, (i+3)%7))
				}
			}
		}()
	}
	wg.Wait()
	cached, _ := s.List()
	if len(cached) == 0 {
		t.Fatal("no records left; the test proves nothing")
	}
	cached[0].Ports[7] = 7 // must not reach the store
	if r, _ := s.Get(cached[0].ID); r.Ports[7] == 7 {
		t.Fatal("a caller's change reached the cached record")
	}
	cached, _ = s.List()
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fromFile, _ := s.List()
	if fmt.Sprint(cached) != fmt.Sprint(fromFile) {
		t.Fatalf("cache and file differ:\ncache %v\nfile  %v", cached, fromFile)
	}
}

func TestAddAddressesFollowsRecords(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "node.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := Sandbox{ID: "a", IP: netip.MustParseAddr("172.16.0.2"), Ports: map[uint16]uint16{49983: 30001}}
	b := Sandbox{ID: "b", IP: netip.MustParseAddr("172.16.0.3"), Ports: map[uint16]uint16{49983: 30002, 8080: 30003}}
	for _, r := range []Sandbox{a, b} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	ips := map[netip.Addr]bool{netip.MustParseAddr("172.16.0.9"): true} // the caller's own entries stay
	ports := map[uint16]bool{}
	s.AddAddresses(ips, ports)
	wantIPs := map[netip.Addr]bool{netip.MustParseAddr("172.16.0.9"): true, b.IP: true}
	wantPorts := map[uint16]bool{30002: true, 30003: true}
	if fmt.Sprint(ips) != fmt.Sprint(wantIPs) || fmt.Sprint(ports) != fmt.Sprint(wantPorts) {
		t.Fatalf("AddAddresses = %v %v, want %v %v", ips, ports, wantIPs, wantPorts)
	}
}
