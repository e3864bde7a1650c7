package nodestore

import (
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// recordCache holds every record decoded, so reads (List, Get) cost no
// transaction and no JSON: a create lists all records under the cubelet's
// allocation lock, and decoding a few hundred records there serialised a
// burst of creates (50 concurrent: allocate p90 67 ms).
//
// The cache is filled once at Open and then changed only by committed
// writes, in commit order (commits are serialised, see commit.go), so it
// always equals the file's contents. Only the Store's own methods write
// the sandboxes bucket.
type recordCache struct {
	mu   sync.RWMutex
	good map[string]Sandbox
	bad  map[string]bool // keys whose value does not decode
	ix   Index           // told of every change (see Store.Track); may be nil
}

func (c *recordCache) load(db *bolt.DB) error {
	c.good, c.bad = map[string]Sandbox{}, map[string]bool{}
	return db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			var sb Sandbox
			if err := json.Unmarshal(v, &sb); err != nil || sb.ID != string(k) {
				c.bad[string(k)] = true
				return nil
			}
			c.good[sb.ID] = sb
			return nil
		})
	})
}

// put and remove apply a committed write.
func (c *recordCache) put(sb Sandbox) {
	c.mu.Lock()
	old, had := c.good[sb.ID]
	c.good[sb.ID] = clone(sb)
	delete(c.bad, sb.ID)
	if c.ix != nil {
		// The new record first: an address both name is never free between.
		c.ix.Add(sb)
		if had {
			c.ix.Remove(old)
		}
	}
	c.mu.Unlock()
}

func (c *recordCache) remove(id string) {
	c.mu.Lock()
	old, had := c.good[id]
	delete(c.good, id)
	delete(c.bad, id)
	if had && c.ix != nil {
		c.ix.Remove(old)
	}
	c.mu.Unlock()
}

// track sets ix and tells it of every record held now.
func (c *recordCache) track(ix Index) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ix = ix
	for _, sb := range c.good {
		ix.Add(sb)
	}
}

func (c *recordCache) get(id string) (Sandbox, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	sb, ok := c.good[id]
	return clone(sb), ok
}

func (c *recordCache) isBad(id string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.bad[id]
}

// list returns copies of every record ordered by id, and the bad keys.
func (c *recordCache) list() (good []Sandbox, bad []string) {
	c.mu.RLock()
	good = make([]Sandbox, 0, len(c.good))
	for _, sb := range c.good {
		good = append(good, clone(sb))
	}
	for k := range c.bad {
		bad = append(bad, k)
	}
	c.mu.RUnlock()
	sort.Slice(good, func(i, j int) bool { return good[i].ID < good[j].ID })
	sort.Strings(bad)
	return good, bad
}

// addresses adds every record's IP and host ports to ips and ports.
func (c *recordCache) addresses(ips map[netip.Addr]bool, ports map[uint16]bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, sb := range c.good {
		ips[sb.IP] = true
		for _, hp := range sb.Ports {
			ports[hp] = true
		}
	}
}

// clone copies sb's maps and slices, so a caller changing a record it
// read never changes the cache.
func clone(sb Sandbox) Sandbox {
	sb.Ports = maps.Clone(sb.Ports)
	sb.AllowOut = slices.Clone(sb.AllowOut)
	sb.DenyOut = slices.Clone(sb.DenyOut)
	return sb
}
