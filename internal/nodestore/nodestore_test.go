package nodestore

import (
	"encoding/json"
	"errors"
	"net/netip"
	"path/filepath"
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
	list, bad, err := s.List()
	if err != nil || len(list) != 1 || len(bad) != 0 {
		t.Fatalf("List = %v %v %v", list, bad, err)
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
	list, bad, err := s.List()
	s.Close()
	if err != nil || len(list) != 1 || len(bad) != 1 || bad[0] != "broken" {
		t.Fatalf("List = %v %v %v", list, bad, err)
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
