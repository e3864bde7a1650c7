// Package nodestore is the cubelet's durable record of what it owns on a
// node. Every sandbox record is written before the first kernel object for
// it is created and deleted after the last one is removed, so a restarted
// cubelet (or an operator) can always tell who owns a link, an nft element,
// a cgroup or a state directory.
package nodestore

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/cube-dev/cube/internal/errdefs"
)

// SchemaVersion is the record schema this binary writes. A store written by
// a newer binary is refused rather than misread.
//
// History: 1 = first schema; 2 = Sandbox.RuntimeID (a sandbox made from a
// pre-started pool slot keeps the slot's state dir, cgroup and shim). A
// schema-1 record reads as RuntimeID "" (= ID), so version 1 stores open
// unchanged; a version-1 cubelet refuses a version-2 store, since it would
// look for such a sandbox's runtime under the wrong name and reap it.
const SchemaVersion = 2

// Sandbox states recorded in the store.
const (
	StateCreating = "creating" // owner record written, kernel objects being made
	StateRunning  = "running"  // fully created; envd answered
	StateDeleting = "deleting" // teardown in progress
	StatePooled   = "pooled"   // a warm-pool slot: IP + netns + veth (+ disk image, or a pre-started sandbox) owned by the pool
)

// Sandbox is the owner record of one sandbox's kernel objects.
type Sandbox struct {
	ID string `json:"id"`
	// RuntimeID names the sandbox's runtime objects (state dir, cgroup,
	// shim, network endpoint, mappings): the id of the record that made
	// them, a pool slot's for a sandbox made from a slot. The cubelet sets
	// it on every record it writes; records of earlier versions may have
	// none, which means ID. Use Runtime().
	RuntimeID     string            `json:"runtimeID,omitempty"`
	Generation    uint64            `json:"generation"`
	Template      string            `json:"template"`
	State         string            `json:"state"`
	IP            netip.Addr        `json:"ip"`
	Ports         map[uint16]uint16 `json:"ports"` // guest port -> host port
	CPUCount      int               `json:"cpuCount"`
	MemoryMB      int               `json:"memoryMB"`
	DiskSizeMB    int               `json:"diskSizeMB"`
	EnvdVersion   string            `json:"envdVersion"`
	AllowInternet bool              `json:"allowInternet"`
	AllowOut      []string          `json:"allowOut,omitempty"`
	DenyOut       []string          `json:"denyOut,omitempty"`
	Paused        bool              `json:"paused,omitempty"`
	CreatedAt     time.Time         `json:"createdAt"`
}

// Runtime returns the name of the sandbox's runtime objects: its state
// dir, cgroup and shim.
func (s Sandbox) Runtime() string {
	if s.RuntimeID != "" {
		return s.RuntimeID
	}
	return s.ID
}

var (
	bucketMeta      = []byte("meta")
	bucketSandboxes = []byte("sandboxes")
	keySchema       = []byte("schema")
	keyGeneration   = []byte("generation")
)

// Store is a bbolt-backed node store.
type Store struct {
	db    *bolt.DB
	c     committer
	cache recordCache
}

// Open opens (creating if needed) the node store at path.
//
// Commits are not fsynced. What the store describes lives no longer than
// the machine (processes, netns pins on /run, links, nftables, cgroups): a
// crash of the agent keeps every commit (it is in the page cache, which
// the next process reads), and after a power loss there is nothing left to
// own. The one risk, a file torn by a power loss, is handled here: a store
// written during an earlier boot is checked, and moved aside for a fresh
// one when it cannot be opened or read (see openStore).
func Open(path string) (*Store, error) {
	db, err := openStore(path)
	if err != nil {
		return nil, fmt.Errorf("open node store %s: %w", path, err)
	}
	s := &Store{db: db}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.cache.load(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("read node store %s: %w", path, err)
	}
	return s, nil
}

func (s *Store) migrate() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketSandboxes); err != nil {
			return err
		}
		if v := meta.Get(keySchema); v != nil {
			var have int
			if err := json.Unmarshal(v, &have); err != nil {
				return fmt.Errorf("node store schema record unreadable: %w", err)
			}
			if have > SchemaVersion {
				return fmt.Errorf("node store schema %d is newer than this cubelet understands (%d): upgrade cubelet: %w",
					have, SchemaVersion, errdefs.ErrFailedPrecondition)
			}
		}
		v, _ := json.Marshal(SchemaVersion)
		return meta.Put(keySchema, v)
	})
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

// NextGeneration returns a node-wide monotonically increasing number, used
// to tell an old owner record from a new one with the same sandbox id.
func (s *Store) NextGeneration() (uint64, error) {
	var gen uint64
	err := s.update(func(tx *bolt.Tx) error {
		gen = 0 // the write may run again (see update)
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keyGeneration); v != nil {
			if err := json.Unmarshal(v, &gen); err != nil {
				return err
			}
		}
		gen++
		v, _ := json.Marshal(gen)
		return meta.Put(keyGeneration, v)
	}, nil)
	return gen, err
}

// Put writes a sandbox record (insert or replace).
func (s *Store) Put(sb Sandbox) error {
	if sb.ID == "" {
		return fmt.Errorf("sandbox record without id: %w", errdefs.ErrInvalidArgument)
	}
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Put([]byte(sb.ID), data)
	}, func() { s.cache.put(sb) })
}

// Get reads one sandbox record.
func (s *Store) Get(id string) (Sandbox, error) {
	if sb, ok := s.cache.get(id); ok {
		return sb, nil
	}
	if s.cache.isBad(id) {
		return Sandbox{}, fmt.Errorf("sandbox %s: record does not decode: %w", id, errdefs.ErrInvalidArgument)
	}
	return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
}

// PutReplacing writes sb and deletes the record `old` in one transaction
// (a warm-pool slot handing its kernel objects to a sandbox).
func (s *Store) PutReplacing(sb Sandbox, old string) error {
	data, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSandboxes)
		if err := b.Put([]byte(sb.ID), data); err != nil {
			return err
		}
		return b.Delete([]byte(old))
	}, func() {
		// put first: a tracked address the two records share (the slot's
		// IP) stays held throughout.
		s.cache.put(sb)
		s.cache.remove(old)
	})
}

// Delete removes a sandbox record; a missing record is not an error.
func (s *Store) Delete(id string) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).Delete([]byte(id))
	}, func() { s.cache.remove(id) })
}

// AddAddresses adds the IP and the host ports of every record to ips and
// ports: what an allocator must not hand out, read without copying the
// records (a create does it under the cubelet's allocation lock).
func (s *Store) AddAddresses(ips map[netip.Addr]bool, ports map[uint16]bool) {
	s.cache.addresses(ips, ports)
}

// Index follows the records: Add is called for every record written and
// Remove for every record replaced or deleted, in commit order, while the
// store's cache is locked (an Index must not call the Store).
type Index interface {
	Add(Sandbox)
	Remove(Sandbox)
}

// Track makes ix follow the records: it is told of every record held now,
// then of every committed change. The cubelet's address free sets are
// built this way (internal/ipam), so they are rebuilt from the records at
// every start and never drift from them.
func (s *Store) Track(ix Index) { s.cache.track(ix) }

// List returns every record, ordered by id. Records that cannot be decoded
// are returned in bad (by key) instead of failing the whole listing, so one
// corrupt record never blocks a node's restart. It reads the decoded copy
// the store keeps (see recordCache).
func (s *Store) List() (good []Sandbox, bad []string) {
	return s.cache.list()
}
